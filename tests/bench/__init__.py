"""`make bench` (`python -m tests.bench`): how fast and how small the bridge is, measured.

Not a test: numbers depend on the machine. It prints a table, then one JSON line.
"""
