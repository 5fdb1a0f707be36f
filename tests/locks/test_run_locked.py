"""run_locked: JobRun bookkeeping, heartbeat loss (semantic 5), outcomes."""

import logging
import os
import time
from datetime import timedelta
from multiprocessing import Pipe
from types import SimpleNamespace

import pytest
from django.utils import timezone

from locks import runner
from locks.lease import ClaimRules, Held, Lease, Skip, acquire, fenced, renew
from locks.models import JobRun, SyncLock, database_now
from locks.operator import force_release
from locks.runner import Lost, run_locked
from tests.locks.conftest import TICK

TTL = timedelta(minutes=5)
pytestmark = pytest.mark.django_db(transaction=True)


def test_a_successful_run_records_stats_and_releases(caplog):
    caplog.set_level(logging.INFO, logger="locks")

    result = run_locked(job="job", tick=TICK, ttl=TTL, fn=lambda lease: {"created": 3}, holder="h:1:a")

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
        f"job=job tick={TICK.isoformat()} holder=h:1:a outcome=succeeded token=1 attempt=1 created=3 duration="
    )


def test_a_failing_job_is_recorded_with_its_error_and_the_lease_freed(caplog):
    def boom(lease):
        raise ValueError("payload was odd")

    result = run_locked(job="job", tick=TICK, ttl=TTL, fn=boom, expected_errors=(ValueError,))

    assert (result.outcome, result.failure.error, result.ok) == ("failed_expected", "payload was odd", False)
    assert JobRun.objects.get().status == "failed"
    assert JobRun.objects.get().error == "payload was odd"
    lock = SyncLock.objects.get()
    assert (lock.locked_until, lock.last_status, lock.last_error) == (None, "failed", "payload was odd")
    errors = [r for r in caplog.records if r.levelno == logging.ERROR]
    assert len(errors) == 1 and not errors[0].exc_info


def test_an_unexpected_exception_keeps_its_traceback_in_the_log(caplog):
    def bug(lease):
        raise KeyError("missing")

    result = run_locked(job="job", tick=TICK, ttl=TTL, fn=bug)

    assert result.outcome == "failed"
    assert result.failure.error == "KeyError: 'missing'"
    [error] = [r for r in caplog.records if r.levelno == logging.ERROR]
    # The original exception and where it was raised, not "NoneType: None".
    assert error.exc_info[1] is result.failure.exception
    assert isinstance(result.failure.exception, KeyError)
    assert error.exc_info[2] is not None
    logged = logging.Formatter().formatException(error.exc_info)
    assert 'raise KeyError("missing")' in logged
    assert "in bug" in logged


def test_a_lease_taken_over_inside_the_job_is_recorded_as_lost_lock():
    def job(lease):
        force_release(job="job", by="another operator")  # the lease changes hands
        renew(lease=lease)  # what the write phase does first (fencing)
        raise AssertionError("unreachable: renew must raise")

    result = run_locked(job="job", tick=TICK, ttl=TTL, fn=job)

    assert result.outcome == "lost_lock"
    assert result.failure.error == "lease on job (token 1) was taken over, released or expired"
    run = JobRun.objects.get()
    assert run.status == "lost_lock"
    lock = SyncLock.objects.get()
    # The lost holder could not overwrite the record of the force release.
    assert lock.last_status == "released"
    assert lock.token == 2


def test_a_skip_runs_nothing_and_records_no_run(caplog):
    caplog.set_level(logging.INFO, logger="locks")
    acquire(job="job", tick=TICK, ttl=TTL, holder="other:9:z")
    called = []

    result = run_locked(job="job", tick=TICK, ttl=TTL, fn=called.append)

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
        force_release(job="job", by="test")
        # Bounded wait for the heartbeat thread to notice (it renews every TTL/3).
        lease._lost.wait(timeout=10)
        lease.check()

    result = run_locked(job="job", tick=TICK, ttl=ttl, fn=job)

    assert result.outcome == "lost_lock"
    assert result.failure.error == "lease on job (token 1) was taken over, released or expired"
    assert JobRun.objects.get().status == "lost_lock"


def test_an_interrupted_job_is_recorded_and_releases_before_the_interrupt_goes_on():
    def interrupted(lease):
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        run_locked(job="job", tick=TICK, ttl=TTL, fn=interrupted)

    assert JobRun.objects.get().status == "failed"
    assert JobRun.objects.get().error == "interrupted: KeyboardInterrupt: no details"
    lock = SyncLock.objects.get()
    assert (lock.locked_until, lock.last_status) == (None, "failed")


def test_a_failed_tick_is_retried_by_a_later_run_and_each_attempt_is_a_run():
    def down(lease):
        raise ValueError("Codeforces answered 503")

    failed = run_locked(job="job", tick=TICK, ttl=TTL, fn=down, expected_errors=(ValueError,))
    retried = run_locked(job="job", tick=TICK, ttl=TTL, fn=lambda lease: {"created": 1})
    again = run_locked(job="job", tick=TICK, ttl=TTL, fn=lambda lease: {"created": 1})

    assert (failed.outcome, retried.outcome, again.outcome) == ("failed_expected", "succeeded", "skipped")
    assert again.reason == f"tick {TICK.isoformat()} already done by {retried.holder}"
    runs = list(JobRun.objects.order_by("started_at", "token").values_list("tick", "token", "status"))
    assert runs == [(TICK, 1, "failed"), (TICK, 2, "succeeded")]


def test_a_run_whose_fenced_write_committed_succeeds_even_if_the_lease_changes_hands():
    def job(lease):
        with fenced(lease):
            JobRun.objects.filter(token=lease.token).update(stats={"written": True})
        force_release(job="job", by="an impatient operator")  # right after the commit
        return {"created": 3}

    result = run_locked(job="job", tick=TICK, ttl=TTL, fn=job)

    assert (result.outcome, result.failure.error, result.stats) == ("succeeded", "", {"created": 3})
    run = JobRun.objects.get()
    assert (run.status, run.error) == ("succeeded", "")
    lock = SyncLock.objects.get()
    assert (lock.tick, lock.tick_done, lock.last_status) == (TICK, True, "released")
    assert isinstance(acquire(job="job", tick=TICK, ttl=TTL), Skip)


@pytest.mark.parametrize(
    "failure",
    [
        pytest.param(lambda lease: JobRun.objects.raw("SELECT nonsense")[0], id="database-error"),
        pytest.param(lambda lease: {}["missing"], id="bug"),
        pytest.param(lambda lease: force_release(job="job") and renew(lease=lease), id="lease-lost"),
    ],
)
def test_a_job_that_fails_after_its_fenced_write_committed_succeeds_with_the_error_kept(failure, caplog):
    """Rule 6: the work is done once the fenced write committed; a failure after it is
    kept on the run and logged as an ERROR, and the tick is never run again."""

    def job(lease):
        with fenced(lease):
            pass
        failure(lease)

    result = run_locked(job="job", tick=TICK, ttl=TTL, fn=job)

    assert (result.outcome, result.ok) == ("succeeded_then_failed", True)
    assert result.failure.error.startswith("after its fenced write committed: "), result.failure.error
    run = JobRun.objects.get()
    assert (run.status, run.error) == ("succeeded", result.failure.error)
    lock = SyncLock.objects.get()
    assert (lock.tick, lock.tick_done, lock.committed_token) == (TICK, True, 1)
    [record] = [r for r in caplog.records if r.name == "locks.api" and "outcome=" in r.getMessage()]
    assert record.levelno == logging.ERROR
    assert "outcome=succeeded" in record.getMessage()
    assert isinstance(acquire(job="job", tick=TICK, ttl=TTL), Skip)


def test_a_job_that_fails_before_committing_leaves_its_tick_to_a_retry():
    def job(lease):
        with fenced(lease):
            raise ValueError("half-way")

    result = run_locked(job="job", tick=TICK, ttl=TTL, fn=job, expected_errors=(ValueError,))

    assert (result.outcome, result.failure.error) == ("failed_expected", "half-way")
    lock = SyncLock.objects.get()
    assert (lock.tick, lock.tick_done, lock.committed_token) == (TICK, False, None)
    assert isinstance(acquire(job="job", tick=TICK, ttl=TTL), Lease)


def test_the_heartbeat_stops_at_the_maximum_run_time_and_the_run_ends_lost_lock(caplog):
    """A stalled job (say, a server sending one byte a second) is ended at its maximum run time."""
    checks = []

    def stalled(lease):
        for _ in range(400):  # at most 20 s
            lease.check()
            checks.append(1)
            time.sleep(0.05)
        raise AssertionError("the maximum run time never ended the run")

    result = run_locked(
        job="job",
        tick=TICK,
        ttl=timedelta(seconds=1.5),  # a beat every 0.5 s
        max_run_time=timedelta(seconds=2),
        fn=stalled,
    )

    assert result.outcome == "lost_lock"
    assert result.failure.error == "ran longer than its maximum run time 0:00:02"
    assert 2 <= result.duration < 4
    assert len(checks) > 30
    run = JobRun.objects.get()
    assert (run.status, run.error) == ("lost_lock", "ran longer than its maximum run time 0:00:02")
    lock = SyncLock.objects.get()
    assert (lock.locked_until, lock.last_status, lock.tick_done) == (None, "lost_lock", False)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == ["job=job heartbeat: ran longer than its maximum run time 0:00:02"]


def test_a_tick_too_far_ahead_is_a_warning_naming_the_host_clock_offset(caplog, monkeypatch):
    """A host whose clock is a day fast names tomorrow's slot: refused, nothing stored."""
    db_now = database_now()
    fast = db_now + timedelta(days=1)
    monkeypatch.setattr(timezone, "now", lambda: fast)
    called = []

    result = run_locked(
        job="job",
        tick=fast.replace(minute=0, second=0, microsecond=0),
        ttl=TTL,
        fn=called.append,
        rules=ClaimRules(horizon=timedelta(hours=1)),
    )

    assert (result.outcome, result.ok, called) == ("tick_ahead", True, [])
    assert result.skip.reason == "tick_ahead"
    assert not SyncLock.objects.exists() and not JobRun.objects.exists()
    [record] = [r for r in caplog.records if r.name == "locks.api"]
    assert record.levelno == logging.WARNING
    message = record.getMessage()
    assert "outcome=skipped reason=tick " in message
    assert " is more than 1:00:00 ahead of the database clock (" in message
    offset = int(message.split("this host's clock is ")[1].split(" s off the database clock")[0])
    assert 86390 <= offset <= 86400


def test_taking_over_closes_the_runs_a_dead_holder_left_running():
    dead = acquire(job="job", tick=TICK, ttl=TTL, holder="dead:1:x")
    JobRun.objects.create(
        job_name="job", tick=TICK, holder="dead:1:x", token=dead.token, started_at=dead.grant.acquired_at
    )
    SyncLock.objects.update(locked_until=dead.grant.acquired_at - TTL)  # its lease ran out long ago

    result = run_locked(job="job", tick=TICK, ttl=TTL, fn=lambda lease: {})

    assert (result.outcome, result.token) == ("succeeded", 2)
    closed = JobRun.objects.get(token=1)
    assert closed.status == "abandoned"
    assert closed.error == "holder dead:1:x stopped renewing; its lease expired and token 2 took over"
    assert closed.finished_at is not None and closed.finished_at >= closed.started_at
    assert JobRun.objects.get(token=2).status == "succeeded"


@pytest.fixture
def scheduler_pipes():
    """This process as a scheduler's worker: its heartbeat tells ``to_scheduler`` of its lease and
    hears from ``from_scheduler`` (locks.scheduler renews the leases of all its workers)."""
    scheduler_reads, to_scheduler = Pipe(duplex=False)
    from_scheduler, scheduler_tells = Pipe(duplex=False)
    runner.PARENT[0] = (to_scheduler, from_scheduler, os.getppid())  # this process's parent stays
    yield SimpleNamespace(reads=scheduler_reads, tells=scheduler_tells)
    runner.PARENT[0] = None


def test_in_a_schedulers_worker_the_run_renews_nothing_and_ends_lost_when_its_scheduler_says(scheduler_pipes):
    """Issue 36, item 4: the scheduler renews; the run hears of a lease lost (an earlier lease's word
    is not its own) and tells the scheduler when its run ends (an empty reason)."""
    ttl = timedelta(seconds=0.3)  # were it to renew its own lease, a beat every 0.1 s
    beats = []

    def job(lease):
        scheduler_pipes.tells.send(Lost("job", lease.token - 1, "an earlier lease's"))
        time.sleep(0.5)
        assert not lease.lost
        beats.append(SyncLock.objects.values_list("acquired_at", "heartbeat_at").get())
        scheduler_pipes.tells.send(Lost("job", lease.token, "lost, says the scheduler"))
        lease._lost.wait(timeout=10)
        lease.check()

    result = run_locked(job="job", tick=TICK, ttl=ttl, fn=job)

    assert (result.outcome, result.failure.error) == ("lost_lock", "lost, says the scheduler")
    assert scheduler_pipes.reads.recv() == Held("job", 1, ttl, result.grant.timeline)
    assert not scheduler_pipes.reads.poll()  # lost: the scheduler had stopped renewing it already
    [(acquired_at, heartbeat_at)] = beats
    assert heartbeat_at == acquired_at  # nothing renewed it in 0.5 s, its run least of all

    run_locked(job="job", tick=TICK + TTL, ttl=TTL, fn=lambda lease: None)

    assert scheduler_pipes.reads.recv() == Held("job", 2, TTL, result.grant.timeline)
    assert scheduler_pipes.reads.recv() == Lost("job", 2, "")


def test_in_a_schedulers_worker_the_maximum_run_time_ends_the_run_and_tells_the_scheduler(scheduler_pipes):
    def stalled(lease):
        lease._lost.wait(timeout=20)
        lease.check()

    result = run_locked(job="job", tick=TICK, ttl=TTL, max_run_time=timedelta(seconds=0.5), fn=stalled)

    assert (result.outcome, result.failure.error) == (
        "lost_lock",
        "ran longer than its maximum run time 0:00:00.500000",
    )
    assert scheduler_pipes.reads.recv() == Held("job", 1, TTL, result.grant.timeline)
    assert scheduler_pipes.reads.recv() == Lost(
        "job", 1, "ran longer than its maximum run time 0:00:00.500000"
    )


def test_a_run_whose_scheduler_is_gone_renews_its_lease_itself(scheduler_pipes):
    """Its scheduler killed in the middle of the run (both pipes end): the run's heartbeat renews the
    lease from then on, and the run ends as it would have, without a traceback."""
    ttl = timedelta(seconds=0.6)  # a beat every 0.2 s once it renews by itself
    beats = []

    def job(lease):
        scheduler_pipes.reads.close()
        scheduler_pipes.tells.close()
        time.sleep(1.0)
        beats.append(SyncLock.objects.values_list("acquired_at", "heartbeat_at").get())
        lease.check()

    result = run_locked(job="job", tick=TICK, ttl=ttl, fn=job)

    assert (result.outcome, result.failure.error) == ("succeeded", "")
    [(acquired_at, heartbeat_at)] = beats
    assert heartbeat_at > acquired_at
