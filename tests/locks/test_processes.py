"""Real OS processes contending for one lock: the race, a SIGKILLed holder, a long job."""

import json
import signal
import time
from datetime import timedelta

import pytest

from locks.lease import Lease, Skip, acquire, release
from locks.models import JobRun, SyncLock
from locks.operator import force_release
from locks.runner import run_locked
from tests.conftest import project_env, spawn
from tests.locks.conftest import TICK

pytestmark = pytest.mark.slow


def test_sixteen_processes_one_tick_exactly_one_acquires(contenders):
    contenders.start(16, "--job", "race", "--tick", TICK.isoformat(), "--run", "1")
    time.sleep(1.5)  # let every interpreter reach the start line; correctness does not depend on it
    contenders.release()
    results = contenders.results()

    winners = [r for r in results if r["outcome"] == "succeeded"]
    losers = [r for r in results if r["outcome"] == "skipped"]
    assert len(winners) == 1, results
    assert len(losers) == 15
    holder = winners[0]["holder"]
    # Every loser says why: held by the winner, or (if it lost after the release) the tick is claimed.
    for loser in losers:
        assert loser["reason"].startswith(
            (f"held by {holder} until ", f"tick {TICK.isoformat()} already done by {holder}")
        ), loser
    lock = SyncLock.objects.get(job_name="race")
    assert (lock.token, lock.holder, lock.locked_until, lock.last_status) == (1, "", None, "succeeded")
    assert JobRun.objects.filter(job_name="race").count() == 1

    # A 17th process, after the winner released, same tick: skips.
    contenders.start(1, "--job", "race", "--tick", TICK.isoformat())
    [late] = contenders.results()
    assert (late["outcome"], late["skip"]) == ("skipped", "tick_claimed")
    assert late["reason"] == f"tick {TICK.isoformat()} already done by {holder}"
    assert JobRun.objects.filter(job_name="race").count() == 1


def _killed_holder(db_url: str, *, ttl: int) -> None:
    """A process that took the lease and died without a word (SIGKILL)."""
    args = ["--job", "kill", "--tick", TICK.isoformat(), "--ttl", str(ttl), "--run", "600"]
    holder = spawn(["-m", "tests.locks.worker", *args], env=project_env(DATABASE_URL=db_url))
    line = holder.stdout.readline()
    assert '"outcome": "acquired"' in line, line
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    assert holder.returncode == -signal.SIGKILL


def test_a_sigkilled_holder_blocks_until_its_lease_expires(db_url):
    _killed_holder(db_url, ttl=3)

    next_tick = TICK + timedelta(hours=1)
    blocked = acquire(job="kill", tick=next_tick, ttl=timedelta(seconds=30))
    assert isinstance(blocked, Skip) and blocked.reason == "held"

    # No cleanup: the lease runs out by itself (3 s TTL) and the next tick proceeds.
    deadline = time.monotonic() + 30
    got = blocked
    while isinstance(got, Skip) and time.monotonic() < deadline:
        time.sleep(0.25)
        got = acquire(job="kill", tick=next_tick, ttl=timedelta(seconds=30))
    assert isinstance(got, Lease), got
    assert got.token == 2


def test_a_sigkilled_holder_is_freed_by_force_release(db_url):
    _killed_holder(db_url, ttl=600)

    released = force_release(job="kill", by="test")
    got = acquire(job="kill", tick=TICK + timedelta(hours=1), ttl=timedelta(seconds=30))

    assert released.changed and released.token == 2
    assert isinstance(got, Lease) and got.token == 3


def test_a_job_three_times_its_ttl_keeps_its_lease(db_url):
    env = project_env(DATABASE_URL=db_url)
    ttl = 2.0  # renewed every 2/3 s; three missed beats in a row would lose it
    job = spawn(
        [
            "-m",
            "tests.locks.worker",
            "--job",
            "long",
            "--tick",
            TICK.isoformat(),
            "--ttl",
            str(ttl),
            "--run",
            str(3 * ttl),
        ],
        env=env,
    )

    deadline = time.monotonic() + 60
    while not JobRun.objects.filter(job_name="long").exists():
        assert job.poll() is None and time.monotonic() < deadline, job.communicate()
        time.sleep(0.05)
    seen_at = time.monotonic()
    skips, late = [], 0
    # Contend (forced: any tick) until the job ends; every attempt while it runs must skip.
    while job.poll() is None and time.monotonic() < deadline:
        got = acquire(job="long", tick=None, ttl=timedelta(seconds=30), holder="contender:0:0")
        if isinstance(got, Lease):
            # Only legitimate once the job has released at its end.
            assert JobRun.objects.get(job_name="long").status == "succeeded", got
            release(lease=got, status="succeeded")
            break
        skips.append(got.reason)
        # Past its first TTL the lease lives only because the heartbeat renewed it.
        late += time.monotonic() - seen_at > 1.2 * ttl
        time.sleep(0.2)
    out, err = job.communicate(timeout=30)

    assert '"outcome": "succeeded"' in out.splitlines()[-1], err
    assert set(skips) == {"held"}
    assert late >= 3, (late, skips)
    run = JobRun.objects.get(job_name="long")
    assert run.status == "succeeded"
    assert run.finished_at - run.started_at > timedelta(seconds=2 * ttl)
    lock = SyncLock.objects.get(job_name="long")
    assert lock.token <= 2  # nobody else held it during the job


def test_a_sigkilled_holders_run_is_closed_as_abandoned_by_the_next_holder(db_url):
    _killed_holder(db_url, ttl=600)
    [dead] = JobRun.objects.filter(job_name="kill")
    assert dead.status == "running"
    SyncLock.objects.filter(job_name="kill").update(locked_until=dead.started_at)  # expired long ago

    result = run_locked(
        job="kill", tick=TICK + timedelta(hours=1), ttl=timedelta(seconds=30), fn=lambda lease: {}
    )

    assert (result.outcome, result.token) == ("succeeded", 2)
    dead.refresh_from_db()
    assert dead.status == "abandoned"
    assert dead.error == f"holder {dead.holder} stopped renewing; its lease expired and token 2 took over"
    assert dead.finished_at is not None


def test_a_holder_sigkilled_right_after_its_commit_is_recorded_succeeded_by_the_next_holder(db_url):
    """Its work is done (the fenced write committed, the tick is done); only its record is
    missing. The next holder closes its run as succeeded, never abandoned."""
    args = ["--job", "kill", "--tick", TICK.isoformat(), "--ttl", "600", "--then", "600"]
    holder = spawn(["-m", "tests.locks.worker", *args], env=project_env(DATABASE_URL=db_url))
    assert '"outcome": "acquired"' in holder.stdout.readline()
    assert '"outcome": "committed"' in holder.stdout.readline()
    holder.send_signal(signal.SIGKILL)
    holder.wait(timeout=10)
    [dead] = JobRun.objects.filter(job_name="kill")
    assert dead.status == "running"
    SyncLock.objects.filter(job_name="kill").update(locked_until=dead.started_at)  # expired long ago
    lock = SyncLock.objects.get(job_name="kill")
    assert (lock.tick, lock.tick_done, lock.committed_token) == (TICK, True, 1)

    again = run_locked(job="kill", tick=TICK, ttl=timedelta(seconds=30), fn=lambda lease: {})
    assert (again.outcome, again.skip.reason) == ("skipped", "tick_claimed")  # its tick is done
    result = run_locked(
        job="kill", tick=TICK + timedelta(hours=1), ttl=timedelta(seconds=30), fn=lambda lease: {}
    )

    assert (result.outcome, result.token) == ("succeeded", 2)
    dead.refresh_from_db()
    assert dead.status == "succeeded"
    assert dead.error == (
        f"holder {dead.holder} committed its fenced write, then stopped before recording it; "
        "token 2 took over"
    )
    assert dead.finished_at is not None


def test_on_sqlite_a_write_longer_than_the_busy_timeout_does_not_starve_its_own_heartbeat(db_url):
    """While this process's fenced write holds the one write lock, its heartbeat does not even
    try to renew (it would wait for its own lock until the busy timeout, 1 s here): the write
    renewed the lease as it began, and nobody can take it meanwhile. The run succeeds."""
    if not db_url.startswith("sqlite:"):
        pytest.skip("SQLite's single write lock is what starves the heartbeat; PostgreSQL locks rows")
    env = project_env(DATABASE_URL=f"{db_url}?timeout=1", LOCKS_LOG_LEVEL="DEBUG")
    # A beat every 2 s: the one at 2 s waits for the 4 s write until 3 s and fails;
    # the write commits at 4 s, within the 6 s its own renewal gave the lease.
    args = ["--job", "write", "--tick", TICK.isoformat(), "--ttl", "6", "--write", "4"]
    worker = spawn(["-m", "tests.locks.worker", *args], env=env)
    out, err = worker.communicate(timeout=60)

    assert worker.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert (result["outcome"], result["error"]) == ("succeeded", ""), err
    assert "job=write heartbeat: its fenced write holds the lock row; not renewing" in err
    assert "database is locked" not in err
    assert "lost_lock" not in err and " WARNING " not in err
    run = JobRun.objects.get(job_name="write")
    assert (run.status, run.error) == ("succeeded", "")
    lock = SyncLock.objects.get(job_name="write")
    assert (lock.last_status, lock.tick_done) == ("succeeded", True)
