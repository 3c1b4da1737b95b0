"""`python -m tools.mutate [MODULE ...]`: see tools/mutate/runner.py."""

from tools.mutate.runner import main

raise SystemExit(main())
