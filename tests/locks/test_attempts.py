"""Retries are counted in the database (docs/architecture.md, "The rules": 12; issue 17,
reproduction 5): a tick gets at most ``1 + len(delays)`` attempts, however many hosts ask, each
not before its delay after the previous one failed. Time by rows written into the past; the
cluster as three real ``run_scheduler`` processes.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from locks.lease import Lease, Skip, acquire, release
from locks.models import JobRun, SyncLock, database_now
from locks.operator import reset_tick
from locks.runner import run_locked
from locks.schedule import Schedule
from tests.conftest import project_env
from tests.locks.conftest import schedulers, wait_for

TICK = datetime(2026, 11, 30, 14, 0, tzinfo=UTC)
TTL = timedelta(seconds=30)
DELAYS = (timedelta(minutes=1), timedelta(minutes=5))


def fail(lease):
    raise RuntimeError("down")


def attempt(holder: str, tick: datetime = TICK):
    return run_locked(job="job", tick=tick, ttl=TTL, fn=fail, holder=holder, retry_delays=DELAYS)


def let_the_retry_delay_pass() -> None:
    SyncLock.objects.update(retry_at=database_now() - timedelta(seconds=1))


@pytest.mark.django_db
def test_a_tick_gets_one_attempt_and_one_per_retry_delay_each_after_its_delay():
    first = attempt("a:1:a")
    early = attempt("b:2:b")  # another host, at once: the delay has not passed
    assert (first.outcome, first.grant.attempt, first.grant.attempts, first.grant.retry_delay) == (
        "failed",
        1,
        3,
        DELAYS[0],
    )
    assert (early.outcome, early.skip.reason) == ("skipped", "retry_later")
    row = SyncLock.objects.get()
    assert row.retry_at - row.last_finished_at == DELAYS[0]
    assert (
        str(early.skip)
        == f"tick {TICK.isoformat()} failed attempt 1; the next may start at {row.retry_at.isoformat()}"
    )

    let_the_retry_delay_pass()
    second = attempt("b:2:b")
    let_the_retry_delay_pass()
    third = attempt("c:3:c")
    let_the_retry_delay_pass()
    fourth = attempt("a:1:a")

    assert [(r.outcome, r.grant.attempt, r.grant.retry_delay) for r in (second, third)] == [
        ("failed", 2, DELAYS[1]),
        ("failed", 3, None),  # the last one: no retry after it
    ]
    assert (fourth.outcome, fourth.skip.reason) == ("skipped", "attempts_used")
    assert str(fourth.skip) == f"tick {TICK.isoformat()} had its 3 attempts and none succeeded"
    runs = JobRun.objects.order_by("token").values_list("holder", "attempt", "status")
    assert list(runs) == [("a:1:a", 1, "failed"), ("b:2:b", 2, "failed"), ("c:3:c", 3, "failed")]
    assert SyncLock.objects.get().tick_attempts == 3


@pytest.mark.django_db
def test_a_new_tick_starts_its_attempts_over_and_a_reset_clears_them():
    for _ in range(3):
        attempt("a:1:a")
        let_the_retry_delay_pass()
    assert attempt("a:1:a").skip.reason == "attempts_used"

    later = attempt("a:1:a", tick=TICK + timedelta(hours=1))
    assert (later.outcome, later.grant.attempt) == ("failed", 1)
    assert reset_tick(job="job", expected_tick=TICK + timedelta(hours=1), by="ops").changed
    row = SyncLock.objects.get()
    assert (row.tick, row.tick_attempts, row.retry_at) == (None, 0, None)


@pytest.mark.django_db
def test_a_holder_that_died_used_its_attempt_and_the_takeover_is_the_next():
    dead = acquire(job="job", tick=TICK, ttl=TTL, retry_delays=DELAYS)
    assert isinstance(dead, Lease) and dead.grant.attempt == 1
    SyncLock.objects.update(locked_until=database_now() - timedelta(seconds=1))  # it stopped renewing

    takeover = acquire(job="job", tick=TICK, ttl=TTL, retry_delays=DELAYS)  # at once: it never failed aloud

    assert isinstance(takeover, Lease) and takeover.grant.attempt == 2
    assert release(lease=takeover, status="succeeded")
    done = acquire(job="job", tick=TICK, ttl=TTL, retry_delays=DELAYS)
    assert isinstance(done, Skip) and done.reason == "tick_claimed"


@pytest.mark.django_db
def test_without_a_retry_policy_a_failed_tick_may_be_claimed_again_at_once():
    """A caller of acquire that names no policy keeps the old rule: no limit, no wait."""
    for number in range(1, 5):
        lease = acquire(job="job", tick=TICK, ttl=TTL)
        assert isinstance(lease, Lease) and lease.grant.attempt == number
        release(lease=lease, status="failed")


# --- three replicas ------------------------------------------------------------------------

SCHEDULE = "* * * * * */10"  # croniter's sixth field: seconds
RETRY = (2, 4)


@pytest.mark.slow
def test_three_schedulers_give_a_failing_tick_its_attempts_once_not_once_each(db_url, tmp_path):
    """Reproduction 5: each scheduler ran the whole retry policy on its own, so a job that always
    fails got up to three times its attempts per tick. Now, per tick across the three: exactly
    1 + len(delays) attempts, numbered 1 to 3, each started at least its delay after the
    previous one finished. Watched: the first slot after all three are up (each caught up the
    slot before it on start, a failing tick too: the watched one's attempts start again at 1)."""
    # A short lease: a copy that found it held asks again soon after it ends (2 s + 1 s).
    env = project_env(
        DATABASE_URL=db_url, REFUSE_SCHEDULE=SCHEDULE, REFUSE_RETRY=",".join(map(str, RETRY)), REFUSE_TTL="2"
    )
    logs = [tmp_path / f"scheduler-{n}.log" for n in range(3)]
    with schedulers(env, logs, "refuse") as procs:
        up = "scheduler: running refuse"
        wait_for(lambda: all(up in log.read_text() for log in logs), timeout=60, what="three schedulers")
        watched = Schedule(SCHEDULE).next_slot(database_now())
        over = watched + timedelta(seconds=9.5)  # a fourth attempt would have started by then
        wait_for(lambda: database_now() >= over, timeout=30, what="the watched slot to pass")
    texts = [log.read_text() for log in logs]

    assert [proc.returncode for proc in procs] == [0, 0, 0], texts
    assert not any("Traceback" in text for text in texts), texts
    runs = list(
        JobRun.objects.filter(job_name="refuse", tick=watched)
        .order_by("started_at")
        .values_list("attempt", "started_at", "finished_at", "status")
    )
    assert [(number, status) for number, _s, _f, status in runs] == [
        (1, "failed"),
        (2, "failed"),
        (3, "failed"),
    ], runs
    for ((_n, _s, finished, _st), (_n2, started, _f2, _st2)), delay in zip(
        pairwise(runs), RETRY, strict=True
    ):
        assert started - finished >= timedelta(seconds=delay) - timedelta(seconds=0.2), runs
