"""Outcomes tell the truth (issue 25, rule 15): a fenced block Django rolled back without raising is
a failure, an unanswered COMMIT is ``unknown`` until the next run resolves it from the row, a
success needs its fenced write on the row, and a force release of a holder whose write committed
records it a success. On SQLite and PostgreSQL (the suite runs on both)."""

from __future__ import annotations

import contextlib
from datetime import timedelta

import pytest
from django.db import DatabaseError, IntegrityError, connection, transaction

from locks import CommitUnknown, NotCommitted, Outcome, acquire, fenced, release, run_locked
from locks.models import ANSWERS, RECORDED, JobRun, SyncLock
from locks.operator import force_release
from locks.registry import get_job
from locks.status import job_ledgers
from tests.jobsapp.models import SlotWrite
from tests.locks.conftest import TICK

pytestmark = pytest.mark.django_db(transaction=True)  # fenced() is the outermost transaction

TTL = timedelta(minutes=5)
RETRY = (timedelta(seconds=60),)


def run(fn, **kwargs):
    return run_locked(job="job", tick=TICK, ttl=TTL, fn=fn, retry_delays=RETRY, **kwargs)


def write(lease) -> None:
    SlotWrite.objects.create(job=lease.job, tick=lease.tick, token=lease.token, holder=lease.holder)


def test_a_fenced_block_rolled_back_by_set_rollback_is_a_failure_and_its_tick_stays_open():
    """Recorded `succeeded` with the tick done and nothing written, before."""

    def body(lease):
        with fenced(lease):
            write(lease)
            transaction.set_rollback(True)

    result = run(body)

    assert (result.outcome, result.failure.error) == (
        "failed",
        "the fenced block of job (token 1) was rolled back",
    )
    assert result.outcome.answer.exit_code == 1 and result.grant.retry_delay == RETRY[0]
    lock = SyncLock.objects.get()
    assert (lock.tick, lock.tick_done, lock.committed_token, lock.tick_attempts) == (TICK, False, None, 1)
    assert lock.retry_at is not None  # its attempts apply: the next one after the retry delay
    assert not SlotWrite.objects.exists()
    assert list(JobRun.objects.values_list("status", flat=True)) == ["failed"]


def test_a_fenced_block_that_caught_an_integrity_error_inside_is_a_failure():
    def body(lease):
        with fenced(lease):
            write(lease)
            # The unique key: an IntegrityError, caught without a savepoint of its own, so Django
            # rolls the whole block back.
            with contextlib.suppress(IntegrityError):
                SyncLock.objects.create(job_name="job")

    result = run(body)

    assert result.outcome == "failed" and "was rolled back" in result.failure.error
    assert not SyncLock.objects.get().tick_done and not SlotWrite.objects.exists()


def test_a_fenced_block_that_swallowed_a_failed_raw_statement_says_it_was_not_committed():
    """Issue 35, item 10: on PostgreSQL a raw statement that fails aborts the transaction; a body
    that swallowed its error made the COMMIT a silent rollback, fenced() returned, and release()
    reported a failover ("not in this database's history"). SQLite goes on after a failed
    statement, so there the block commits."""

    def body(lease):
        with fenced(lease):
            write(lease)
            with contextlib.suppress(DatabaseError), connection.cursor() as cursor:
                cursor.execute("SELECT 1 / 0")

    result = run(body)

    if connection.vendor != "postgresql":
        assert result.outcome == "succeeded" and SlotWrite.objects.count() == 1
        return
    assert (result.outcome, result.failure.error) == (
        "failed",
        "the fenced block of job (token 1) was rolled back: a statement in it failed and the database "
        "aborted its transaction (the error was caught inside the block)",
    )
    lock = SyncLock.objects.get()
    assert (lock.tick_done, lock.committed_token, lock.failover_note) == (False, None, "")
    assert not SlotWrite.objects.exists()


def test_a_committed_block_is_still_a_success():
    def body(lease):
        with fenced(lease):
            write(lease)

    result = run(body)

    answer = result.outcome.answer
    assert (result.outcome, answer.exit_code, answer.http_status) == ("succeeded", 0, 200)
    assert SyncLock.objects.get().tick_done and SlotWrite.objects.count() == 1


def unanswered(lease) -> None:
    """What ``fenced`` raises when its COMMIT got no answer and the row could not be read back."""
    raise CommitUnknown("the COMMIT of the fenced write of job (token 1) got no answer")


def test_an_unanswered_commit_is_unknown_never_failed():
    result = run(unanswered)

    assert result.outcome == Outcome.UNKNOWN
    assert (result.outcome.answer.exit_code, result.outcome.answer.http_status) == (1, 503)
    assert list(JobRun.objects.values_list("status", flat=True)) == ["unknown"]
    assert SyncLock.objects.get().last_status == "unknown"


def test_the_next_run_resolves_an_unknown_run_as_failed_when_the_row_shows_no_commit():
    run(unanswered)
    SyncLock.objects.update(retry_at=None)  # its retry delay passed

    second = run(lambda lease: None)

    assert second.outcome == "succeeded"
    first = JobRun.objects.get(token=1)
    assert first.status == "failed"
    assert first.error == "resolved by token 2: the lock row shows its fenced write did not commit"


def test_the_next_run_resolves_an_unknown_run_as_succeeded_when_the_row_shows_its_commit():
    # A run whose fenced write committed, recorded unknown (its COMMIT's answer was lost and the
    # row could not be read back then: tests/faults/test_unknown_outcomes.py makes that for real).
    lease = acquire(job="job", tick=None, ttl=TTL)
    JobRun.objects.create(
        job_name="job", holder=lease.holder, token=lease.token, started_at=lease.grant.acquired_at
    )
    with fenced(lease):
        write(lease)
    ended = lease.grant.acquired_at + timedelta(seconds=1)
    JobRun.objects.filter(token=lease.token).update(status=Outcome.UNKNOWN, finished_at=ended)
    release(lease=lease, status=Outcome.UNKNOWN)

    run_locked(job="job", tick=None, ttl=TTL, fn=lambda lease: None)

    resolved = JobRun.objects.get(token=1)
    assert resolved.status == "succeeded"
    assert resolved.error == "resolved by token 2: the lock row shows its fenced write committed"
    assert resolved.finished_at == ended  # when it really ended, not when it was resolved


def test_a_run_that_committed_then_stopped_is_settled_succeeded_ending_at_its_start_not_at_the_takeover():
    """Its holder died after its fenced write committed, before it recorded its end: when it ended is
    not known (after its start, before its lease expired). The next holder recorded the takeover's
    time, so /healthz's last success and the ledger read it later than it was (a slot later, for a
    job whose next run comes at its next slot); its start is the bound that never reads late."""
    lease = acquire(job="job", tick=None, ttl=TTL)
    JobRun.objects.create(
        job_name="job", holder=lease.holder, token=lease.token, started_at=lease.grant.acquired_at
    )
    with fenced(lease):
        write(lease)
    SyncLock.objects.update(locked_until=lease.grant.acquired_at)  # it stopped; its lease expired

    taken_over = run_locked(job="job", tick=None, ttl=TTL, fn=lambda lease: None)

    assert (taken_over.outcome, taken_over.token) == ("succeeded", 2)
    dead = JobRun.objects.get(token=1)
    assert dead.status == "succeeded" and dead.error.endswith(
        "then stopped before recording it; token 2 took over"
    )
    assert dead.finished_at == dead.started_at


def test_an_unknown_slot_is_neither_failed_nor_missed_in_the_ledger(settings):
    settings.LOCKS_JOBS = {"job": {"schedule": "0 14 30 11 *", "callable": "tests.jobsapp.jobs.record"}}
    JobRun.objects.create(job_name="job", tick=TICK, holder="h", token=1, started_at=TICK, status="unknown")

    ledger = job_ledgers(jobs=[get_job("job")], slots=3)["job"]

    assert ledger.slots[0].tick == TICK and ledger.slots[0].outcome == Outcome.UNKNOWN
    assert ledger.counts[Outcome.FAILED] == 0 and ledger.counts[Outcome.UNKNOWN] == 1


def test_a_success_whose_fenced_write_the_row_does_not_show_is_recorded_failed():
    """The worst case of a failover: the write committed on the old primary only and the release
    reaches the new one, whose row has no committed token (issue 26)."""
    lease = acquire(job="job", tick=TICK, ttl=TTL, retry_delays=RETRY)
    with fenced(lease):
        write(lease)
    SyncLock.objects.update(committed_token=None, tick_done=False)  # the surviving history

    with pytest.raises(NotCommitted, match=r"its fenced write \(token 1\) is not in this database's history"):
        release(lease=lease, status=Outcome.SUCCEEDED)

    lock = SyncLock.objects.get()
    assert (lock.tick_done, lock.last_status, lock.locked_until) == (False, "failed", None)
    assert lock.retry_at is not None


def test_a_run_whose_write_vanished_before_its_release_is_failed_not_succeeded():
    def body(lease):
        with fenced(lease):
            write(lease)
        SyncLock.objects.update(committed_token=None, tick_done=False)  # as if lost in a failover

    result = run(body)

    assert result.outcome == "failed"
    assert result.failure.error == "its fenced write (token 1) is not in this database's history"
    assert JobRun.objects.get().status == "failed" and not SyncLock.objects.get().tick_done


def test_force_release_of_a_holder_whose_write_committed_records_it_succeeded():
    lease = acquire(job="job", tick=TICK, ttl=TTL, holder="web-1:1:a")
    JobRun.objects.create(
        job_name="job", tick=TICK, holder=lease.holder, token=lease.token, started_at=lease.grant.acquired_at
    )
    with fenced(lease):
        write(lease)

    assert force_release(job="job", by="cli:ops").changed

    runs = JobRun.objects.get()
    assert (runs.status, runs.error) == (
        "succeeded",
        "force-released by cli:ops after its fenced write committed",
    )


def test_force_release_of_a_holder_that_wrote_nothing_records_lost_lock():
    lease = acquire(job="job", tick=TICK, ttl=TTL, holder="web-1:1:a")
    JobRun.objects.create(
        job_name="job", tick=TICK, holder=lease.holder, token=lease.token, started_at=lease.grant.acquired_at
    )

    force_release(job="job", by="cli:ops")

    assert JobRun.objects.get().status == "lost_lock"


def test_every_outcome_a_run_comes_to_has_one_row_and_what_is_stored_is_unchanged():
    not_a_run = {Outcome.RUNNING, Outcome.RELEASED, Outcome.ABANDONED, Outcome.MISSED, Outcome.PAUSED}
    assert set(ANSWERS) == set(Outcome) - not_a_run - {Outcome.PENDING}
    assert [value for value, _label in RECORDED] == [
        *("running", "succeeded", "failed", "unknown", "lost_lock", "released", "abandoned", "skipped")
    ]
    assert {outcome.recorded for outcome in ANSWERS} <= {*(value for value, _label in RECORDED), "broke"}
    assert (Outcome.LOST_LOCK.recorded, Outcome.LOST_LOCK.reported) == ("lost_lock", "failed")
    assert (Outcome.FAILED_EXPECTED.recorded, Outcome.FAILED_EXPECTED.answer[:2]) == ("failed", (1, 502))
