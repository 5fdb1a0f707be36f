"""Benchmarks: the sync, the lock and reminder pruning against naive code and the floor.

Run ``python -m bench --help`` (or ``make bench``); docs/benchmarks.md has the results.
"""
