"""run_locked: JobRun bookkeeping, heartbeat loss (semantic 5), outcomes."""

import logging
from datetime import timedelta

import pytest

from locks import api
from locks.models import JobRun, SyncLock
from tests.locks.conftest import TICK

TTL = timedelta(minutes=5)
pytestmark = pytest.mark.django_db(transaction=True)


def test_a_successful_run_records_stats_and_releases(caplog):
    caplog.set_level(logging.INFO, logger="locks")

    result = api.run_locked(job="job", tick=TICK, ttl=TTL, fn=lambda lease: {"created": 3}, holder="h:1:a")

    assert (result.outcome, result.token, result.stats) == ("succeeded", 1, {"created": 3})
    run = JobRun.objects.get()
    assert (run.status, run.stats, run.tick, run.holder, run.token) == (
        "succeeded",
        {"created": 3},
        TICK,
        "h:1:a",
        1,
    )
    assert run.finished_at is not None and run.finished_at >= run.started_at
    lock = SyncLock.objects.get()
    assert (lock.locked_until, lock.last_status, lock.last_error) == (None, "succeeded", "")
    assert lock.last_finished_at is not None
    [record] = [r for r in caplog.records if r.name == "locks.api"]
    assert record.levelno == logging.INFO
    assert record.getMessage().startswith(
        f"job=job tick={TICK.isoformat()} holder=h:1:a outcome=succeeded token=1 created=3 duration="
    )


def test_a_failing_job_is_recorded_with_its_error_and_the_lease_freed(caplog):
    def boom(lease):
        raise ValueError("payload was odd")

    result = api.run_locked(job="job", tick=TICK, ttl=TTL, fn=boom, expected_errors=(ValueError,))

    assert (result.outcome, result.error, result.ok) == ("failed", "payload was odd", False)
    assert JobRun.objects.get().status == "failed"
    assert JobRun.objects.get().error == "payload was odd"
    lock = SyncLock.objects.get()
    assert (lock.locked_until, lock.last_status, lock.last_error) == (None, "failed", "payload was odd")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and not errors[0].exc_info


def test_an_unexpected_exception_keeps_its_traceback_in_the_log(caplog):
    def bug(lease):
        raise KeyError("missing")

    result = api.run_locked(job="job", tick=TICK, ttl=TTL, fn=bug)

    assert result.outcome == "failed"
    assert result.error == "KeyError: 'missing'"
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    # The original exception and where it was raised, not "NoneType: None".
    assert error.exc_info[1] is result.exception
    assert isinstance(result.exception, KeyError)
    assert error.exc_info[2] is not None
    logged = logging.Formatter().formatException(error.exc_info)
    assert 'raise KeyError("missing")' in logged
    assert "in bug" in logged


def test_a_lease_taken_over_inside_the_job_is_recorded_as_lost_lock():
    def job(lease):
        api.force_release(job="job", by="another operator")  # the lease changes hands
        api.renew(lease=lease)  # what the write phase does first (fencing)
        raise AssertionError("unreachable: renew must raise")

    result = api.run_locked(job="job", tick=TICK, ttl=TTL, fn=job)

    assert result.outcome == "lost_lock"
    assert result.error == "lease on job (token 1) was taken over, released or expired"
    run = JobRun.objects.get()
    assert run.status == "lost_lock"
    lock = SyncLock.objects.get()
    # The lost holder could not overwrite the record of the force release.
    assert lock.last_status == "released"
    assert lock.token == 2


def test_a_skip_runs_nothing_and_records_no_run(caplog):
    caplog.set_level(logging.INFO, logger="locks")
    api.acquire(job="job", tick=TICK, ttl=TTL, holder="other:9:z")
    called = []

    result = api.run_locked(job="job", tick=TICK, ttl=TTL, fn=called.append)

    assert (result.outcome, result.ok, called) == ("skipped", True, [])
    assert result.reason.startswith("held by other:9:z until ")
    assert not JobRun.objects.exists()
    [record] = [r for r in caplog.records if r.name == "locks.api"]
    assert (
        record.levelno == logging.INFO and "outcome=skipped reason=held by other:9:z" in record.getMessage()
    )


def test_the_heartbeat_marks_a_taken_over_lease_lost():
    ttl = timedelta(seconds=0.6)  # heartbeat every 0.2 s

    def job(lease):
        api.force_release(job="job", by="test")
        # Bounded wait for the heartbeat thread to notice (it renews every TTL/3).
        lease._lost.wait(timeout=10)
        lease.check()

    result = api.run_locked(job="job", tick=TICK, ttl=ttl, fn=job)

    assert result.outcome == "lost_lock"
    assert result.error == "lease on job (token 1) was taken over, released or expired"
    assert JobRun.objects.get().status == "lost_lock"


def test_an_interrupted_job_is_recorded_and_releases_before_the_interrupt_goes_on():
    def interrupted(lease):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        api.run_locked(job="job", tick=TICK, ttl=TTL, fn=interrupted)

    assert JobRun.objects.get().status == "failed"
    assert JobRun.objects.get().error == "interrupted: KeyboardInterrupt: no details"
    lock = SyncLock.objects.get()
    assert (lock.locked_until, lock.last_status) == (None, "failed")
