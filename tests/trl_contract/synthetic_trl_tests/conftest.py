"""Stands for TRL's tests/conftest.py (empty here)."""
