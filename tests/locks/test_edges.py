"""The edges the model of the lease found (tests/locks/test_model.py, issue 35), each pinned down as
an example: a claim whose answer was lost, a signal during the fenced COMMIT, a lease of an
older database history releasing or reading back the new holder's. On SQLite and PostgreSQL."""

from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta
from unittest import mock

import pytest
from django.db import DEFAULT_DB_ALIAS, OperationalError, connections
from django.db.models import BigIntegerField, F, Value

from locks import Lease, Skip, acquire, fenced, release, run_locked
from locks.lease import ClaimRules, read_back_commit
from locks.models import JobPause, JobRun, SyncLock
from locks.operator import pause_job, reset_tick
from tests.jobsapp.models import SlotWrite
from tests.locks.conftest import TICK, register

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


@contextmanager
def after_the_claim(exc: BaseException):
    """The claim's UPDATE of the lock row (a statement that commits by itself) takes effect, then
    ``exc`` is raised: its answer lost."""
    sent = []

    def claim(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.startswith('UPDATE "locks_synclock"') and not sent:
            sent.append(sql)
            raise exc
        return result

    with connections[DEFAULT_DB_ALIAS].execute_wrapper(claim):
        yield sent


def test_a_claim_whose_answer_was_lost_is_read_back_and_its_body_runs():
    """Was: "database unreachable", no run, and the slot's one attempt used by a lease nobody ran
    under (the ledger: missed). The claim was a transaction whose COMMIT answer was lost then; it is
    a statement that commits by itself now."""
    SyncLock.objects.create(job_name="job")  # acquire's first UPDATE is the claim

    with after_the_claim(OperationalError("server closed the connection unexpectedly")) as sent:
        result = run_locked(job="job", tick=TICK, ttl=TTL, fn=write, retry_delays=ONE_ATTEMPT)

    assert len(sent) == 1

    assert (result.outcome, result.token, result.grant.attempt) == ("succeeded", 1, 1)
    assert SlotWrite.objects.get().token == 1
    lock = SyncLock.objects.get()
    assert (lock.tick, lock.tick_done, lock.tick_attempts, lock.locked_until) == (TICK, True, 1, None)
    assert list(JobRun.objects.values_list("status", flat=True)) == ["succeeded"]


def test_a_signal_during_the_fenced_commit_is_read_back_and_the_run_is_recorded_succeeded():
    """Was: recorded failed ("interrupted") while the row said the tick was done and the write existed."""

    def body(lease):
        with after_the_next_commit(SystemExit(143)):
            write(lease)

    with pytest.raises(SystemExit):
        run_locked(job="job", tick=TICK, ttl=TTL, fn=body, retry_delays=ONE_ATTEMPT)

    run = JobRun.objects.get()
    assert (run.status, run.error) == (
        "succeeded",
        "after its fenced write committed: interrupted: SystemExit: 143",
    )
    assert SlotWrite.objects.get().token == run.token
    lock = SyncLock.objects.get()
    assert (lock.tick_done, lock.last_status, lock.locked_until) == (True, "succeeded", None)


@pytest.fixture
def timeline():
    """``timeline(n)``: what the lease reads as the server's history (a PostgreSQL timeline) from
    now on, on every backend: a promotion is ``timeline(n + 1)``."""
    now = [1]

    def history(*, using):
        return {
            name: Value(value, output_field=BigIntegerField())
            for name, value in (("timeline", now[0]), ("system_id", 7))
        }

    with mock.patch("locks.lease.history", history):
        yield lambda number: now.__setitem__(0, number)


def test_a_lease_of_the_old_history_neither_releases_nor_reads_back_the_new_holders_lease(timeline):
    """An asynchronous failover lost the claim of token 1 on timeline 1, and token 1 was granted
    again on timeline 2. Was: the old lease's release cleared the new holder's lease (a third
    process took it while the holder ran) and its read-back took the new holder's commit for its own."""
    SyncLock.objects.create(job_name="job")
    before = SyncLock.objects.filter(job_name="job").values().get()
    old = acquire(job="job", tick=TICK, ttl=TTL, holder="old")
    SyncLock.objects.filter(job_name="job").update(**before)  # the claim never reached the standby
    timeline(2)
    new = acquire(job="job", tick=TICK, ttl=TTL, holder="new")
    assert (old.token, old.grant.timeline, new.token, new.grant.timeline) == (1, 1, 1, 2)

    assert release(lease=old, status="failed") is False
    assert SyncLock.objects.get().holder == "new"
    third = acquire(job="job", tick=TICK + timedelta(hours=1), ttl=TTL, holder="third")
    assert isinstance(third, Skip) and third.reason == "held"

    write(new)
    assert read_back_commit(new) is True
    assert read_back_commit(old) is None  # the row no longer tells about the old history's token 1


def test_a_commit_read_back_of_a_lock_row_that_is_gone_cannot_tell():
    """A lost COMMIT answer, then the row deleted (an operator's DELETE, a restore): the read-back says
    it cannot tell (None: the run is unknown), where it raised KeyError without a timeline (SQLite)."""
    lease = acquire(job="job", tick=TICK, ttl=TTL)
    SyncLock.objects.filter(job_name="job").delete()

    assert read_back_commit(lease) is None


def test_a_failover_pause_whose_run_was_interrupted_still_binds_the_next_run(timeline):
    """Issue 35, item 2: on_failover "pause" after a failover whose first run never committed its
    pause (a SIGTERM before its body, a database error, a crash). Was: only that run saw the failover
    (acquire had re-stamped the row), so the next run ran the body: the re-send the pause prevents."""
    ran = []

    def body(lease):
        ran.append(lease.tick)
        write(lease)

    run = {"job": "job", "ttl": TTL, "fn": body, "rules": ClaimRules(pause_on_failover=True)}
    assert run_locked(tick=TICK, **run).outcome == "succeeded"  # the row is stamped timeline 1
    timeline(2)
    with (
        mock.patch("locks.runner._pause_on_failover", side_effect=SystemExit(143)),
        pytest.raises(SystemExit),
    ):
        run_locked(tick=TICK + timedelta(hours=1), **run)

    result = run_locked(tick=TICK + timedelta(hours=2), **run)

    assert ran == [TICK]
    assert result.skip is not None and result.skip.reason == "paused"
    lock = SyncLock.objects.get()
    assert lock.paused_by == "locks:failover"
    assert lock.paused_note.startswith(
        "paused on a database failover: the database failed over since token 1"
    )
    assert JobPause.objects.get().paused_by == "locks:failover"


def test_an_operators_pause_between_a_claim_and_its_failover_pause_stands(timeline, settings):
    """on_failover "pause": the claim finds a failover, and an operator pauses the job before the
    claim's failover stamp. Was: the stamp wrote the failover's pause over the operator's (who and
    why lost) and opened a second pause in the history."""
    register(settings, job={"schedule": "0 * * * *", "callable": "tests.jobsapp.jobs.write_slot"})
    run = {"job": "job", "ttl": TTL, "fn": write, "rules": ClaimRules(pause_on_failover=True)}
    assert run_locked(tick=TICK, **run).outcome == "succeeded"  # the row is stamped timeline 1
    timeline(2)
    seen = []

    def operator_after_the_claim(execute, sql, params, many, context):
        if seen == ["claim"]:  # the claim's statement is done: the pause comes before the next one
            seen.append("paused")
            pause_job(job="job", by="admin:ops", note="maintenance")
        if sql.startswith('UPDATE "locks_synclock"') and not seen:
            seen.append("claim")
        return execute(sql, params, many, context)

    with connections[DEFAULT_DB_ALIAS].execute_wrapper(operator_after_the_claim):
        run_locked(tick=TICK + timedelta(hours=1), **run)

    assert seen == ["claim", "paused"]
    lock = SyncLock.objects.get()
    assert (lock.paused_by, lock.paused_note, lock.failover_note != "") == ("admin:ops", "maintenance", True)
    assert list(JobPause.objects.filter(resumed_at=None).values_list("paused_by", flat=True)) == ["admin:ops"]


def test_a_repeated_release_gives_an_unused_attempt_back_once():
    """runner._record_finish repeats a release whose answer was lost, on a new connection. The repeat
    of one that gave back its unused attempt (a run interrupted before its body) gave it back again:
    below zero, the database refused it, and the run was left unrecorded (found while prototyping the
    tick row, issue 36)."""
    lease = acquire(job="job", tick=TICK, ttl=TTL, retry_delays=ONE_ATTEMPT)

    assert release(lease=lease, status="failed", used=False)
    assert release(lease=lease, status="failed", used=False)  # the repeat

    lock = SyncLock.objects.get()
    assert (lock.tick, lock.tick_attempts, lock.locked_until, lock.tick_done) == (TICK, 0, None, False)
    again = acquire(job="job", tick=TICK, ttl=TTL, retry_delays=ONE_ATTEMPT)
    assert isinstance(again, Lease) and again.grant.attempt == 1


def test_an_expired_lease_gives_its_unused_attempt_back_only_to_its_own_tick():
    """A lease that expired (its holder stalled), its tick reset by an operator meanwhile (the lease
    is not held, so the reset is allowed): its release gave the attempt back to the row all the same,
    below the reset's zero, and the database refused it (found by the model, its release drawing a
    body that never ran)."""
    lease = acquire(job="job", tick=TICK, ttl=TTL, retry_delays=ONE_ATTEMPT)
    SyncLock.objects.update(locked_until=F("locked_until") - 2 * TTL)
    assert reset_tick(job="job", expected_tick=TICK, by="test").changed

    assert release(lease=lease, status="failed", used=False)

    lock = SyncLock.objects.get()
    assert (lock.tick, lock.tick_attempts, lock.locked_until, lock.tick_done) == (None, 0, None, False)


def test_a_fenced_block_that_does_not_settle_keeps_an_earlier_blocks_commit():
    """``fenced(lease, settle=False)`` after a ``fenced(lease)`` that committed, then an error: the
    slot's write is in, so the run succeeded then failed and its slot is done. Was: the later block
    set the lease back to not committed, the run failed and its slot was tried again (on a database
    without transactions, its release also cleared the committed token)."""

    def body(lease):
        write(lease)
        with fenced(lease, settle=False):
            pass
        raise RuntimeError("after both blocks")

    result = run_locked(job="job", tick=TICK, ttl=TTL, fn=body, retry_delays=(timedelta(seconds=30),))

    assert result.outcome == "succeeded_then_failed"
    lock = SyncLock.objects.get()
    assert (lock.tick_done, lock.committed_token) == (True, result.token)
