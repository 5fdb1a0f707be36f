"""The edges the model of the lease found (tests/locks/test_model.py, issue 35), each pinned down as
an example: a claim whose COMMIT answer was lost, a signal during the fenced COMMIT, a lease of an
older database history releasing or reading back the new holder's. On SQLite and PostgreSQL."""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta

import pytest
from django.db import DEFAULT_DB_ALIAS, OperationalError, connections

from locks import Lease, fenced, run_locked
from locks.models import JobRun, SyncLock
from tests.jobsapp.models import SlotWrite
from tests.locks.conftest import TICK

pytestmark = pytest.mark.django_db(transaction=True)

TTL = timedelta(minutes=5)
ONE_ATTEMPT = ()  # a job without retries: its slot's one attempt


@contextmanager
def after_the_next_commit(exc: BaseException):
    """The next COMMIT on this connection takes effect, then ``exc`` is raised: its answer lost
    (a database error), or a signal that arrived during it (SystemExit, as run_job's SIGTERM)."""
    wrapper = connections[DEFAULT_DB_ALIAS]
    real = wrapper._commit

    def commit():
        del wrapper._commit
        real()
        raise exc

    wrapper._commit = commit
    try:
        yield
    finally:
        wrapper.__dict__.pop("_commit", None)


def write(lease: Lease) -> None:
    with fenced(lease):
        SlotWrite.objects.create(job=lease.job, tick=lease.tick, token=lease.token, holder=lease.holder)


def test_a_claim_whose_commit_answer_was_lost_is_read_back_and_its_body_runs():
    """Was: "database unreachable", no run, and the slot's one attempt used by a lease nobody ran
    under (the ledger: missed)."""
    SyncLock.objects.create(job_name="job")  # acquire's first COMMIT is the claim's

    with after_the_next_commit(OperationalError("server closed the connection unexpectedly")):
        result = run_locked(job="job", tick=TICK, ttl=TTL, fn=write, retry_delays=ONE_ATTEMPT)

    assert (result.outcome, result.token, result.attempt) == ("succeeded", 1, 1)
    assert SlotWrite.objects.get().token == 1
    lock = SyncLock.objects.get()
    assert (lock.tick, lock.tick_done, lock.tick_attempts, lock.locked_until) == (TICK, True, 1, None)
    assert list(JobRun.objects.values_list("status", flat=True)) == ["succeeded"]
