"""The test host project's jobs: what a project of its own registers in LOCKS_JOBS
(tests/hostproject/settings.py). Each receives its lease and returns its counts."""

from __future__ import annotations

import os
import time
from pathlib import Path

from locks import fenced
from tests.jobsapp.models import SlotWrite


class Refused(RuntimeError):
    """An expected failure (listed in the job's expected_errors)."""


def write_slot(lease) -> dict:
    """One row for the slot, inside the fenced transaction (renewed on the token first)."""
    with fenced(lease):
        SlotWrite.objects.create(job=lease.job, tick=lease.tick, token=lease.token, holder=lease.holder)
    return {"written": 1}


def slow_write(lease) -> dict:
    """``write_slot`` after SLOW_WRITE_SECONDS (default 2) of work before the write."""
    time.sleep(float(os.environ.get("SLOW_WRITE_SECONDS", "2")))
    return write_slot(lease)


def record(lease) -> dict:
    """Writes nothing: it checks its lease and reports the TTL the lease got."""
    lease.check()  # before "writing": the lease is still ours
    return {"recorded": 1, "ttl": int(lease.ttl.total_seconds())}


def refuse(lease) -> None:
    """Fails as its job expects, after REFUSE_SECONDS (default 0) of work."""
    time.sleep(float(os.environ.get("REFUSE_SECONDS", "0")))
    raise Refused("nothing to record today")


def preview() -> dict:
    return {"would_record": 1}


def linger(lease) -> None:
    time.sleep(60)  # stopped by SIGTERM in the test


def wait_for_release(lease) -> dict:
    """Blocks until the file RELEASE_FILE exists (at most 60 s), then succeeds: a run a test
    holds open for as long as it likes, and then lets finish, with no sleep race."""
    release = Path(os.environ["RELEASE_FILE"])
    deadline = time.monotonic() + 60
    while not release.exists():
        if time.monotonic() > deadline:
            raise TimeoutError(f"{release} never appeared")
        time.sleep(0.05)
    lease.check()
    return {"released": 1}


def flaky(lease) -> dict:
    """Fails (an expected error) while the file FLAKY_FILE exists, succeeds otherwise."""
    if Path(os.environ["FLAKY_FILE"]).exists():
        raise Refused(f"{os.environ['FLAKY_FILE']} says fail")
    return {"ok": 1}
