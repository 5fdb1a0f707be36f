"""A second job, registered by tests beside the sync: tiny callables run under the lease.

No Django imports at module level: ``tests.locks.settings`` reads ``TEST_JOBS`` while
the settings are still being built.
"""

from __future__ import annotations

import time


class Refused(RuntimeError):
    """An expected failure (listed in the job's expected_errors)."""


def record(lease) -> dict:
    lease.check()  # before "writing": the lease is still ours
    return {"recorded": 1, "ttl": int(lease.ttl.total_seconds())}  # the job's TTL reached the lease


def refuse(lease) -> None:
    raise Refused("nothing to record today")


def linger(lease) -> None:
    time.sleep(60)  # stopped by SIGTERM in the test


def preview() -> dict:
    return {"would_record": 1}


RECORD = {
    "schedule": "*/5 * * * *",
    "callable": "tests.locks.jobs.record",
    "ttl": 60,
    "max_run_time": 120,
    "retry": {"delays": [30, 60]},
    "dry_run": "tests.locks.jobs.preview",
}
TEST_JOBS = {
    "record": RECORD,
    "refuse": {
        **RECORD,
        "callable": "tests.locks.jobs.refuse",
        "expected_errors": ["tests.locks.jobs.Refused"],
    },
    "linger": {"schedule": "*/5 * * * *", "callable": "tests.locks.jobs.linger", "ttl": 60},
}


def register(settings, **jobs: dict) -> None:
    """Register ``jobs`` beside the project's own for one test (a new dict: undone afterwards)."""
    settings.LOCKS_JOBS = {**settings.LOCKS_JOBS, **jobs}


def reschedule(settings, job: str, expression: str) -> None:
    """Give one registered job another schedule for one test."""
    settings.LOCKS_JOBS = {**settings.LOCKS_JOBS, job: {**settings.LOCKS_JOBS[job], "schedule": expression}}
