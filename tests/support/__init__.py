"""One way for tests to start the parts of a fleet on loopback (fleet.py)."""
