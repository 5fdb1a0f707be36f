"""``run_scheduler``'s pool of workers (issue 36, item 3), as real processes on a real database.

Each run's holder names its process (``host:pid:suffix``): over many slots the runs of a
replica come from at most ``LOCKS_SCHEDULER_WORKERS`` processes, and on PostgreSQL the
replica opens about that many connections, not one per slot.
"""

from __future__ import annotations

import errno
import os
import signal
import subprocess
import time
from collections import Counter
from datetime import UTC, datetime, timedelta
from itertools import pairwise
from pathlib import Path
from types import SimpleNamespace

import pytest
from django.db import connection
from django.db.models.functions import Now

from locks.models import JobRun, Outcome, SyncLock, Tick, database_now
from locks.operator import force_release
from locks.runner import RunResult
from locks.scheduler import Pool, Scheduler, _Plan
from tests.conftest import project_env
from tests.locks.conftest import wait_for
from tests.locks.test_scheduler import HOURLY, FakeClock
from tests.locks.test_scheduler_processes import parent_of, start, succeeded_ticks

EVERY_2_S = "* * * * * */2"  # croniter's sixth field: seconds
# LOCKS_SCHEDULER_WORKERS: each ask in a child of its own, or in a pool's worker.
EACH_EXECUTOR = pytest.mark.parametrize("workers", ["0", "1"], ids=["a-child-per-run", "a-pool"])


def pid_of(holder: str) -> int:
    return int(holder.split(":")[1])


def holders(job: str) -> list[str]:
    return list(JobRun.objects.filter(job_name=job).order_by("tick").values_list("holder", flat=True))


def stop(scheduler: subprocess.Popen, *, timeout: float = 30) -> tuple[str, float]:
    """SIGTERM; its stderr and how long it took to exit (killed if not within ``timeout``)."""
    scheduler.send_signal(signal.SIGTERM)
    began = time.monotonic()
    try:
        _out, err = scheduler.communicate(timeout=timeout)
    finally:
        if scheduler.poll() is None:
            scheduler.kill()
            scheduler.communicate()
    return err, time.monotonic() - began


def gone(pid: int) -> bool:
    """No such process, or only its exit status left (a zombie)."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return True
    return "\nState:\tZ" in status


def assert_each_slot_once(job: str, *, at_least: int) -> None:
    ticks = Counter(JobRun.objects.filter(job_name=job, status="succeeded").values_list("tick", flat=True))
    assert set(ticks.values()) == {1}, ticks
    ordered = sorted(ticks)
    assert len(ordered) >= at_least, ordered
    assert all(later - earlier == timedelta(seconds=2) for earlier, later in pairwise(ordered)), ordered


def two_jobs_every_2_s(db_url: str, *, slots: int) -> str:
    """One scheduler with two workers, write_slot and slow_write (0.5 s of work) every 2 s,
    stopped once each ran ``slots`` slots; its stderr."""
    env = project_env(
        DATABASE_URL=db_url,
        WRITE_SLOT_SCHEDULE=EVERY_2_S,
        SLOW_WRITE_SCHEDULE=EVERY_2_S,
        SLOW_WRITE_SECONDS="0.5",
        LOCKS_SCHEDULER_WORKERS="2",
    )
    scheduler = start(env, "write_slot", "slow_write")
    try:
        for job in ("write_slot", "slow_write"):
            wait_for(
                lambda job=job: len(succeeded_ticks(job)) >= slots, timeout=60, what=f"{slots} slots of {job}"
            )
    finally:
        err, _took = stop(scheduler)
    assert scheduler.returncode == 0 and "Traceback" not in err, err
    return err


def slow_write_env(
    db_url: str, *, schedule: str, seconds: float, ttl: int = 3, workers: str = "1", **more: str
) -> dict[str, str]:
    """slow_write on ``schedule`` with ``seconds`` of work on a ``ttl`` s lease (3), ``workers`` (one)."""
    return project_env(
        DATABASE_URL=db_url,
        SLOW_WRITE_SCHEDULE=schedule,
        SLOW_WRITE_SECONDS=str(seconds),
        SLOW_WRITE_TTL=str(ttl),
        LOCKS_SCHEDULER_WORKERS=workers,
        **more,
    )


@pytest.mark.slow
def test_a_worker_killed_in_the_middle_of_a_run_is_replaced_and_the_next_slots_run(db_url):
    env = slow_write_env(db_url, schedule="* * * * * */3", seconds=1)
    scheduler = start(env, "slow_write")
    try:
        wait_for(lambda: len(succeeded_ticks("slow_write")) >= 1, timeout=30, what="a slot of slow_write")
        running = JobRun.objects.filter(job_name="slow_write", status="running")
        wait_for(running.exists, timeout=10, what="a run of slow_write")
        victim = running.get()
        worker = pid_of(victim.holder)
        assert parent_of(worker) == scheduler.pid
        assert worker in {pid_of(holder) for holder in holders("slow_write")[:-1]}  # it ran earlier slots too
        os.kill(worker, signal.SIGKILL)
        later = JobRun.objects.filter(job_name="slow_write", status="succeeded", tick__gt=victim.tick)
        wait_for(lambda: later.count() >= 2, timeout=30, what="two slots after the kill")
        replacement = pid_of(later.order_by("-tick").first().holder)
        alive = parent_of(replacement) == scheduler.pid  # a worker: still there after its run
    finally:
        err, _took = stop(scheduler)

    assert scheduler.returncode == 0 and "Traceback" not in err, err
    assert "job=slow_write: its run's process ended without an answer" in err
    assert alive and replacement != worker
    ticks = sorted(later.values_list("tick", flat=True))
    assert all(b - a == timedelta(seconds=3) for a, b in pairwise(ticks)), ticks
    succeeded = Counter(JobRun.objects.filter(status="succeeded").values_list("tick", flat=True))
    assert set(succeeded.values()) == {1}, succeeded


@pytest.mark.slow
def test_a_hanging_job_in_the_only_worker_never_holds_another_jobs_slot(db_url):
    env = project_env(
        DATABASE_URL=db_url,
        WRITE_SLOT_SCHEDULE=EVERY_2_S,
        LOCKS_SCHEDULER_WORKERS="1",
        LOCKS_SCHEDULER_GRACE="1",
    )
    scheduler = start(env, "linger", "write_slot")  # linger first: on start it catches up its slot
    try:
        hanging = JobRun.objects.filter(job_name="linger", status="running")
        wait_for(hanging.exists, timeout=30, what="linger to start")
        wait_for(lambda: len(succeeded_ticks("write_slot")) >= 4, timeout=30, what="four slots of write_slot")
        still = hanging.exists()
    finally:
        err, took = stop(scheduler)

    assert scheduler.returncode == 0 and "Traceback" not in err, err
    assert still
    assert_each_slot_once("write_slot", at_least=4)
    worker = pid_of(JobRun.objects.get(job_name="linger").holder)
    others = [pid_of(holder) for holder in holders("write_slot")]
    assert worker not in others and len(set(others)) == len(others)  # each in a child of its own
    assert took < 10  # the 1 s grace, then SIGUSR1: not linger's 60 s
    run = JobRun.objects.get(job_name="linger")
    assert run.status == "failed" and "SystemExit: 0" in run.error


@pytest.mark.slow
def test_sigterm_lets_a_workers_run_finish_within_the_grace_and_the_idle_workers_exit(db_url):
    env = project_env(
        DATABASE_URL=db_url,
        SLOW_WRITE_SCHEDULE="* * * * * */3",
        SLOW_WRITE_SECONDS="2",
        WRITE_SLOT_SCHEDULE=EVERY_2_S,
        LOCKS_SCHEDULER_WORKERS="4",
        LOCKS_SCHEDULER_GRACE="5",
    )
    scheduler = start(env, "slow_write", "write_slot")
    try:
        wait_for(lambda: len(succeeded_ticks("slow_write")) >= 1, timeout=30, what="a slot of slow_write")
        running = JobRun.objects.filter(job_name="slow_write", status="running")
        wait_for(running.exists, timeout=10, what="a run of slow_write")
        last = running.get()
    finally:
        err, took = stop(scheduler)

    assert scheduler.returncode == 0 and "Traceback" not in err, err
    assert "scheduler: stopped" in err
    assert took < 5  # the run's 2 s, and no wait for the idle workers
    assert JobRun.objects.get(pk=last.pk).status == "succeeded"  # it finished within the grace
    assert not JobRun.objects.filter(status="running").exists()
    assert SyncLock.objects.get(job_name="slow_write").locked_until is None
    pids = {pid_of(holder) for holder in JobRun.objects.values_list("holder", flat=True)}
    assert all(gone(pid) for pid in pids), pids


@pytest.mark.slow
def test_on_postgresql_a_workers_connection_the_server_ended_is_replaced_before_its_next_run(db_url):
    """The server ends the idle worker's connection, and the scheduler's own (an administrator, a
    restart, an idle timeout): the next claim and run open new ones at once, not after an ask that
    failed on the old."""
    if connection.vendor != "postgresql":
        pytest.skip("pg_terminate_backend is PostgreSQL's")
    # Every 6 s: the connections are ended while the worker is idle, well before the next slot's ask.
    env = project_env(DATABASE_URL=db_url, WRITE_SLOT_SCHEDULE="* * * * * */6", LOCKS_SCHEDULER_WORKERS="1")
    since = database_now()  # a backend an earlier test's process left ending started before
    scheduler = start(env, "write_slot")
    others = (
        "SELECT pid FROM pg_stat_activity WHERE datname = current_database() AND pid <> pg_backend_pid() "
        "AND backend_start >= %s"
    )
    released = SyncLock.objects.filter(job_name="write_slot", locked_until=None)
    busy = JobRun.objects.filter(job_name="write_slot", status="running")
    claimed = Tick.objects.filter(job_name="write_slot", status="claimed")
    backends: list[int] = []

    def idle() -> bool:
        """Both idle: the run released its lease and recorded its outcome (its last statement), the
        scheduler closed its claim (its connection is open), and the next slot is 3 s away or more
        (under CI's load a later check let the next ask start as its connection was ended)."""
        if busy.exists() or not released.exists() or claimed.exists() or time.time() % 6 > 3:
            return False
        with connection.cursor() as cursor:
            cursor.execute(others, [since])
            backends[:] = [pid for (pid,) in cursor.fetchall()]
        return len(backends) == 2  # the worker's, and the scheduler's own (its claims)

    try:
        wait_for(lambda: len(succeeded_ticks("write_slot")) >= 1, timeout=30, what="a slot of write_slot")
        wait_for(idle, timeout=30, what="the worker and the scheduler idle, each connected")
        ended = succeeded_ticks("write_slot")[-1]  # before: a slot may run while they are being ended
        with connection.cursor() as cursor:
            for pid in backends:
                cursor.execute("SELECT pg_terminate_backend(%s, 5000)", [pid])  # once it has ended
        later = JobRun.objects.filter(job_name="write_slot", tick__gt=ended, finished_at__isnull=False)
        wait_for(lambda: later.count() >= 2, timeout=30, what="two more slots")
    finally:
        err, _took = stop(scheduler)

    assert scheduler.returncode == 0 and "Traceback" not in err, err
    assert "unreachable" not in err and "WARNING" not in err, err
    after = JobRun.objects.filter(job_name="write_slot", tick__gt=ended).order_by("tick")
    assert [(run.status, run.attempt) for run in after[:2]] == [("succeeded", 1)] * 2
    assert len({pid_of(run.holder) for run in JobRun.objects.all()}) == 1  # the same worker


def sleepy(*, name: str, due: datetime) -> RunResult:
    """A run of 0.2 s that names the process it ran in."""
    time.sleep(0.2)
    return RunResult(job=name, tick=due, holder=f"test:{os.getpid()}:000000", outcome=Outcome.SUCCEEDED)


def test_a_burst_of_short_runs_waits_for_a_worker_that_keeps_answering_not_a_process_each():
    """Eight asks of 0.2 s for one worker, 1.6 s of work: each waits while the worker answers (busy,
    not stuck). Before, an ask that had waited 1 s got a process of its own whatever the workers
    did: the last three here, and under load most of a burst (the bench's 100 x 3: 19.5 forks a
    minute at a load average of 20). A worker that stops answering still spills them after 1 s
    (test_a_hanging_job_in_the_only_worker_never_holds_another_jobs_slot)."""
    due = datetime(2030, 1, 1, tzinfo=UTC)
    pool = Pool(sleepy, 1)
    for index in range(8):
        pool.start(_Plan(job=SimpleNamespace(name=f"burst_{index}"), index=index), due=due)
    results, deadline = [], time.monotonic() + 60
    while len(results) < 8 and time.monotonic() < deadline:
        results += [outcome for _plan, outcome in pool.collect(1.0)]
    pool.retire()

    assert len(results) == 8
    assert len({pid_of(result.holder) for result in results}) == 1, [result.holder for result in results]


@pytest.mark.slow
def test_the_scheduler_renews_its_workers_leases_and_tells_a_run_whose_lease_it_lost(db_url):
    """Issue 36, item 4: a worker's run does not renew its own lease; its scheduler renews the leases
    of all its workers, one statement a beat (TTL/3), and tells a run whose lease it could not renew.
    A 4 s run on a 3 s lease writes under it; a run force-released in its middle hears of it from
    its scheduler."""
    env = slow_write_env(db_url, schedule="* * * * * */5", seconds=4, LOCKS_LOG_LEVEL="DEBUG")
    runs = JobRun.objects.filter(job_name="slow_write")
    scheduler = start(env, "slow_write")
    try:
        wait_for(lambda: runs.filter(status="succeeded").exists(), timeout=60, what="a run of slow_write")
        running = runs.filter(status="running")
        wait_for(running.exists, timeout=60, what="the next run of slow_write")
        token = running.get().token
        assert force_release(job="slow_write", expected_token=token, by="test").changed
        ended = runs.filter(token=token).exclude(status="running")  # told, it went on to its write
        wait_for(ended.exists, timeout=60, what="the force-released run to end")
    finally:
        err, _took = stop(scheduler)

    assert scheduler.returncode == 0 and "Traceback" not in err, err
    succeeded = runs.filter(status="succeeded").order_by("tick").first()
    assert succeeded.finished_at - succeeded.started_at > timedelta(seconds=4)  # a lease of 3 s, renewed
    assert "scheduler: heartbeat: 1 of 1 leases renewed" in err
    lost = (
        f"job=slow_write heartbeat: lease on slow_write (token {token}) was taken over, released or expired"
    )
    assert lost in err


@pytest.mark.slow
@EACH_EXECUTOR
def test_a_run_whose_scheduler_was_killed_renews_its_lease_itself_and_succeeds(db_url, workers):
    """Rule 5: "a worker whose scheduler is gone renews its lease itself again until its run ends"
    (``runner._Heartbeat._told``: its scheduler is no longer its parent). The scheduler's pipe alone would
    not tell: the forked run's process holds a copy of its write end (``tell``), so the pipe never ends.
    A 5 s run on a 3 s lease, its scheduler SIGKILLed as it begins."""
    env = slow_write_env(db_url, schedule="* * * * * */10", seconds=5, workers=workers)
    runs = JobRun.objects.filter(job_name="slow_write")
    scheduler = start(env, "slow_write")
    try:
        wait_for(runs.filter(status="running").exists, timeout=60, what="a run of slow_write")
        scheduler.kill()
        run = runs.get()
        wait_for(lambda: runs.exclude(status="running").exists(), timeout=30, what="the run to end")
    finally:
        scheduler.kill()
        scheduler.communicate(timeout=30)

    assert runs.values_list("pk", "status", "error").get() == (run.pk, "succeeded", "")


def test_a_worker_that_died_while_idle_is_replaced_at_the_next_ask():
    """A worker that dies between two asks (the OOM killer picks the largest process: a worker keeps the
    memory of the big runs it made) is in the idle list, whose pipes no one watches: the next ask's send
    to it fails, and the ask goes to a new worker. Before, that BrokenPipeError raised out of
    ``_dispatch`` and ``Scheduler.step``, ending run_scheduler and every other job's slots with it."""
    due = datetime(2030, 1, 1, tzinfo=UTC)
    pool = Pool(sleepy, 1)
    try:
        pool.start(_Plan(job=SimpleNamespace(name="first"), index=0), due=due)
        first, deadline = [], time.monotonic() + 30
        while not first and time.monotonic() < deadline:
            first += pool.collect(1.0)
        ((worker, _pipe),) = pool.idle
        os.kill(worker.pid, signal.SIGKILL)  # while it waits for its next ask
        worker.join(timeout=10)

        pool.start(_Plan(job=SimpleNamespace(name="second"), index=1), due=due)
        second = []
        while not second and time.monotonic() < deadline:
            second += pool.collect(1.0)
    finally:
        pool.retire()

    assert [(plan.job.name, outcome.outcome) for plan, outcome in second] == [("second", Outcome.SUCCEEDED)]


def cannot_fork(*_args, **_kwargs) -> SimpleNamespace:
    """A process that cannot start: the host's pid limit reached (EAGAIN)."""

    def start() -> None:
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")

    return SimpleNamespace(start=start)


@pytest.mark.django_db(transaction=True)
@EACH_EXECUTOR
def test_a_fork_that_fails_is_an_ask_that_broke_and_the_loop_goes_on(workers):
    """A container at its pid limit: the ask cannot get a process (a child of its own, or a pool's worker).
    That ask came to no run, as one whose process died does ("broke": asked again after a backoff,
    its claim ended at once for any copy to take); the loop goes on for the other jobs. It raised out of
    ``step()`` before, which ended ``run_forever`` and the command: the runs still going got no grace, and
    its claims stood for their TTL."""
    clock = FakeClock(datetime(2030, 1, 1, 14, tzinfo=UTC))
    scheduler = Scheduler(jobs=[HOURLY], now=clock.now, workers=int(workers), claim=True)
    scheduler.executor.context = SimpleNamespace(Pipe=scheduler.executor.context.Pipe, Process=cannot_fork)

    scheduler.step()

    plan = scheduler.plans[0]
    assert plan.again_at is not None and not plan.running
    assert Tick.objects.filter(job_name="hourly", until__lte=Now()).exists()  # open to every copy
