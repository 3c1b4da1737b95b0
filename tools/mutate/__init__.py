"""Mutation testing of the pure decision cores: `make mutate` (see docs/testing.md)."""
