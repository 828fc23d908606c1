"""The helpers that run_trl_tests.py copies beside TRL's test file (empty here)."""
