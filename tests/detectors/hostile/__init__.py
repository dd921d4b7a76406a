"""Hostile saved detectors for the security tests (see cases.py)."""
