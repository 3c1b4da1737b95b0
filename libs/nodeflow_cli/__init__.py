"""`kubectl nodeflow` (the console script `kubectl-nodeflow`): verdicts, decisions, dead letters."""
