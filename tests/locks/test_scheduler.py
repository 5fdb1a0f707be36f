"""run_scheduler's loop: when it asks for a tick, with a fake clock.

The decisions (ask at each slot, catch up on start, ask again after a failed attempt's retry
delay, look again after a lease held elsewhere expires, back off while the database cannot be
reached, ask again at once while catch_up "all" has slots behind) are tested against a
recording stand-in for ``run_job``, run in this process (``Inline``); the real runs, against
the database and as several processes (each ask in a child), follow.
"""

from __future__ import annotations

import gc
import logging
import threading
import tracemalloc
from collections import Counter
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from locks import schedule
from locks.lease import Grant, Skip
from locks.lease import Pause as OperatorPause
from locks.models import JobRun
from locks.registry import CatchUp, Job, jobs
from locks.runner import RunResult
from locks.schedule import InvalidTick, Schedule
from locks.scheduler import Scheduler
from tests.hostproject.settings import RECORD

HOURLY = Job(
    name="hourly",
    cron=Schedule("0 * * * *"),
    callable_path="tests.jobsapp.jobs.record",
    ttl=timedelta(seconds=60),
    max_run_time=None,
    retry_delays=(timedelta(minutes=1), timedelta(minutes=5), timedelta(minutes=15)),
)


class FakeClock:
    """Time that passes only while the loop waits; it stops the loop at ``end``."""

    def __init__(self, start: datetime, end: datetime | None = None) -> None:
        self.at, self.end = start, end
        self.stop = threading.Event()

    def now(self) -> datetime:
        return self.at

    def wait(self, seconds: float) -> None:
        self.at += timedelta(seconds=seconds)
        if self.end is not None and self.at >= self.end:
            self.stop.set()


class Runs:
    """Stands in for run_job: records what was asked and answers with the given outcomes."""

    def __init__(self, clock: FakeClock, outcomes: list | None = None) -> None:
        self.clock = clock
        self.outcomes = list(outcomes or [])
        self.asked: list[tuple[datetime, datetime]] = []  # (when, tick)

    def __call__(self, *, name: str, due: datetime) -> RunResult:
        self.asked.append((self.clock.now(), due))
        outcome = self.outcomes.pop(0) if self.outcomes else "succeeded"
        if isinstance(outcome, Exception):
            raise outcome
        if isinstance(outcome, Skip):
            return RunResult(job=name, tick=due, holder="h", outcome="skipped", skip=outcome)
        if isinstance(outcome, RunResult):
            return outcome
        return RunResult(job=name, tick=due, holder="h", outcome=outcome)


def failed(retry_after: timedelta | None, outcome: str = "failed") -> RunResult:
    """A failed attempt as run_locked returns it: the database counted it, and says how long
    until the next may start (None: it was the last)."""
    return RunResult(
        job="hourly", tick=None, holder="h", outcome=outcome, grant=Grant(retry_delay=retry_after)
    )


UNREACHABLE = RunResult(job="hourly", tick=None, holder="h", outcome="unreachable")


def at(hour: int, minute: int = 0, second: int = 0) -> datetime:
    return datetime(2026, 12, 2, hour, minute, second, tzinfo=UTC)


def loop(start: datetime, outcomes=None, *, until: datetime, job: Job = HOURLY) -> Runs:
    clock = FakeClock(start, until)
    runs = Runs(clock, outcomes)
    Scheduler(jobs=[job], now=clock.now, run=runs, stop=clock.stop).run_forever(wait=clock.wait)
    return runs


def test_on_start_it_catches_up_the_current_slot_then_asks_at_each_slot():
    runs = loop(at(10, 31), until=at(12, 30))

    # 10:31 is past the tick window of 11:00: the current slot is 10:00, run late.
    assert runs.asked[0] == (at(10, 31), at(10))
    assert [tick for _when, tick in runs.asked] == [at(10), at(11), at(12)]
    assert [when for when, _tick in runs.asked[1:]] == [at(11), at(12)]


def test_a_failed_tick_is_asked_again_after_each_delay_never_past_the_next_slot():
    minutes = [timedelta(minutes=m) for m in (1, 5, 15)]
    outcomes = [failed(minutes[0]), failed(minutes[1], "lost_lock"), failed(minutes[2]), failed(None)]
    runs = loop(at(10), outcomes, until=at(11, 30))

    assert runs.asked == [
        (at(10), at(10)),
        (at(10, 1), at(10)),
        (at(10, 6), at(10)),
        (at(10, 21), at(10)),  # the last delay of the policy
        (at(11), at(11)),  # no fourth retry: the next slot has its own run
    ]


def test_a_retry_that_would_reach_the_next_slot_is_dropped():
    outcomes = [failed(timedelta(minutes=m)) for m in (1, 5, 15)]
    runs = loop(at(10, 50), outcomes, until=at(11, 30))

    # 10:50 + 1 min, then + 5 min = 10:56, then + 15 min would be 11:11: dropped.
    assert [when for when, _tick in runs.asked] == [at(10, 50), at(10, 51), at(10, 56), at(11)]


def test_a_success_or_a_tick_done_elsewhere_is_not_asked_again():
    done = Skip("hourly", at(10), "tick_claimed", "other:1:abc", None, at(10))
    runs = loop(at(10), ["succeeded", done], until=at(12, 30))

    assert [tick for _when, tick in runs.asked] == [at(10), at(11), at(12)]


def test_a_lease_held_elsewhere_is_looked_at_again_once_it_would_have_expired():
    # The database's clock is a minute behind this host's: the lease ends 10 minutes from now.
    held = Skip("hourly", at(10), "held", "other:1:abc", at(10, 9), at(10), db_now=at(9, 59))
    runs = loop(at(10), [held, "succeeded"], until=at(10, 30), job=replace(HOURLY, retry_delays=()))

    assert runs.asked == [(at(10), at(10)), (at(10, 10, 1), at(10))]


def test_a_lease_held_elsewhere_is_looked_at_again_after_the_first_retry_delay_if_sooner():
    held = Skip("hourly", at(10), "held", "other:1:abc", at(10, 9), at(10), db_now=at(9, 59))
    runs = loop(at(10), [held, "succeeded"], until=at(10, 30))

    assert runs.asked == [(at(10), at(10)), (at(10, 1, 1), at(10))]  # HOURLY's first retry: 1 min


# send_reminders' schedule, TTL and retry (config/settings.py): a lease that outlasts the slot's chance.
MINUTELY = replace(
    HOURLY,
    name="minutely",
    cron=Schedule("* * * * *"),
    ttl=timedelta(seconds=120),
    retry_delays=(timedelta(seconds=20),),
)


def test_a_slot_held_by_a_run_now_longer_than_its_chance_is_asked_again_within_it():
    """The operator's Run now of send_reminders at the minute (a forced run: it claims no slot) holds the
    lease for its TTL, 120 s, renewed while it runs its few seconds. The scheduler's ask for the slot is told
    "held by ... until" two minutes on, past the slot's chance: it is not asked again, though the lease row
    runs it as soon as the forced run ends. The minute is missed (check_jobs opens an incident for it). With
    copies beside it a loser's look (after the first retry delay) may rescue the slot; a lone replica never
    does, whether it claims ticks or not."""
    held = Skip("minutely", at(10), "held", "runnow:1:abc", at(10, 2), at(9, 59), db_now=at(10))
    clock = FakeClock(at(10), at(10, 0, 59))
    runs = Runs(clock, [held, "succeeded"])
    Scheduler(jobs=[MINUTELY], now=clock.now, run=runs, stop=clock.stop).run_forever(wait=clock.wait)

    assert [tick for _when, tick in runs.asked] == [at(10), at(10)]


def test_another_hosts_failed_attempt_is_asked_again_when_the_next_may_start():
    wait = Skip(
        "hourly", at(10), "retry_later", "", None, at(10), db_now=at(10), attempts=1, retry_at=at(10, 5)
    )
    used = Skip("hourly", at(10), "attempts_used", "", None, at(10), db_now=at(10, 5), attempts=3)
    runs = loop(at(10), [wait, used, "succeeded"], until=at(11, 30))

    # Once every attempt is used, the tick is not asked for again: the next slot is.
    assert runs.asked == [(at(10), at(10)), (at(10, 5), at(10)), (at(11), at(11))]


class Pause:
    """Stands in for the lock row's pause: paused until ``until`` on the fake clock."""

    def __init__(self, clock: FakeClock, until: datetime) -> None:
        self.clock, self.until, self.reads = clock, until, 0

    def __call__(self, name: str) -> bool:
        self.reads += 1
        return self.clock.now() < self.until


def paused_loop(start: datetime, outcomes, *, resumed: datetime, until: datetime) -> tuple[Runs, Pause]:
    clock = FakeClock(start, until)
    runs, pause = Runs(clock, outcomes), Pause(clock, resumed)
    Scheduler(jobs=[HOURLY], now=clock.now, run=runs, stop=clock.stop, paused=pause).run_forever(
        wait=clock.wait
    )
    return runs, pause


PAUSED = Skip("hourly", at(10), "paused", "", None, None, pause=OperatorPause("alice", at(9)))


def test_a_paused_job_is_asked_again_as_soon_as_it_is_resumed_10_s_before_its_chance_ends():
    """Issue 27, item 5: resumed at 10:59:50, the 10:00 slot (its chance ends at 11:00) runs at
    once, not lost; meanwhile only its lock row is read (every 5 s), no run is asked."""
    runs, pause = paused_loop(at(10), [PAUSED, "succeeded"], resumed=at(10, 59, 50), until=at(11, 30))

    assert runs.asked == [(at(10), at(10)), (at(10, 59, 50), at(10)), (at(11), at(11))]
    assert pause.reads == len(range(5, 59 * 60 + 55, 5))  # 10:00:05 … 10:59:50, every 5 s


def test_a_job_paused_for_its_whole_slot_is_asked_no_later_than_the_next_slot():
    runs, _pause = paused_loop(at(10, 57), [PAUSED, PAUSED, "succeeded"], resumed=at(11, 2), until=at(11, 30))

    # 10:57, then the next slot (not 11:00 for 10:00): a paused slot's asks end with its chance;
    # the 11:00 slot is asked once more as soon as the job is resumed.
    assert runs.asked == [(at(10, 57), at(10)), (at(11), at(11)), (at(11, 2), at(11))]


def test_an_unreachable_database_is_asked_again_with_a_backoff_until_the_next_slot():
    """Issue 17, reproduction 6: one "database unreachable" skip ended the slot, so a 0.2 s
    restart at :00 lost the hour. It costs no attempt, and is asked again 1 s later, the
    waits doubling to at most 30 s, never past the next slot."""
    restart = loop(at(10), [UNREACHABLE, "succeeded"], until=at(11, 30))
    assert restart.asked == [(at(10), at(10)), (at(10, 0, 1), at(10)), (at(11), at(11))]

    down = loop(at(10), [UNREACHABLE] * 200, until=at(11, 0, 1))
    whens = [when for when, _tick in down.asked]
    assert whens[:7] == [
        at(10),
        at(10, 0, 1),
        at(10, 0, 3),
        at(10, 0, 7),
        at(10, 0, 15),
        at(10, 0, 31),
        at(10, 1, 1),
    ]
    gaps = {(later - earlier).total_seconds() for earlier, later in pairwise(whens[6:-1])}
    assert gaps == {30.0}
    assert whens[-2] < at(11) == whens[-1]  # the new slot: asked at once, the backoff starts over
    assert all(tick == at(10) for when, tick in down.asked if when < at(11))


def test_a_lock_row_locked_by_a_write_in_progress_is_looked_at_again_with_a_backoff():
    locked = Skip("hourly", at(10), "held", "frozen:1:x", at(9, 59), at(10), db_now=at(10), locked=True)
    runs = loop(at(10), [locked, locked, locked, "succeeded"], until=at(10, 30))

    assert [when for when, _tick in runs.asked] == [at(10), at(10, 0, 1), at(10, 0, 3), at(10, 0, 7)]


def test_under_catch_up_all_a_slot_behind_that_settled_is_followed_at_once_by_the_next():
    job = replace(HOURLY, catch_up=CatchUp("all"))
    clock = FakeClock(at(10, 30), at(11, 30))
    behind = [
        RunResult(job="hourly", tick=at(8), holder="h", outcome="succeeded", claimed="behind"),
        RunResult(
            job="hourly", tick=at(9), holder="h", outcome="failed", claimed="behind"
        ),  # its last attempt
        RunResult(job="hourly", tick=at(10), holder="h", outcome="succeeded"),
    ]
    runs = Runs(clock, behind)
    Scheduler(jobs=[job], now=clock.now, run=runs, stop=clock.stop).run_forever(wait=clock.wait)

    assert runs.asked == [(at(10, 30), at(10))] * 3 + [(at(11), at(11))]


def test_a_job_that_raises_is_logged_and_the_loop_goes_on(caplog):
    runs = loop(at(10), [KeyError("bug"), "succeeded"], until=at(11, 30))

    assert runs.asked == [(at(10), at(10)), (at(10, 0, 1), at(10)), (at(11), at(11))]  # again 1 s later
    errors = [record for record in caplog.records if record.levelname == "ERROR"]
    assert (
        errors[0].getMessage()
        == "scheduler: job=hourly tick=2026-12-02T10:00:00+00:00 raised; the loop goes on"
    )
    assert isinstance(errors[0].exc_info[1], KeyError)


def test_a_tick_refused_as_too_far_ahead_is_not_asked_again_until_the_next_slot(caplog):
    """run_job raises InvalidTick when the lease refuses the tick the loop named (this
    host's clock is fast; run_locked logged the WARNING): no retry, no ERROR."""
    runs = loop(
        at(10),
        [InvalidTick("tick 2026-12-02T10:00:00+00:00 is more than ..."), "succeeded"],
        until=at(11, 30),
    )

    assert [tick for _when, tick in runs.asked] == [at(10), at(11)]
    assert not [record for record in caplog.records if record.levelno >= logging.ERROR]


def test_a_slot_ahead_of_the_database_clock_is_asked_again_when_the_database_reaches_it():
    """Issue 35, item 13: the lease refuses the scheduler's slot before its time on the database
    clock (this host's is 3 s fast); the loop asks again once the database's clock is there."""
    ahead = Skip("hourly", at(10), "tick_ahead", "", None, None, db_now=at(9, 59, 57), horizon=timedelta(0))

    runs = loop(at(10), [ahead, "succeeded"], until=at(10, 30))

    assert runs.asked == [(at(10), at(10)), (at(10, 0, 4), at(10))]


def test_a_scheduler_five_minutes_fast_runs_each_slot_of_a_burst_at_its_time_on_the_database_clock():
    """Issue 35, item 13: a lone copy 5 minutes fast, `54-59 0 * * *`. Its first ask is refused as
    ahead of the database clock; from then on it names and asks for slots on the database's time:
    each of the six runs once, none before its time."""
    clock = FakeClock(at(0, 50), at(1, 10))
    behind = timedelta(minutes=5)  # the database clock, behind this host's
    ran = []

    def run(*, name: str, due: datetime) -> RunResult:
        db_now = clock.now() - behind
        if due > db_now:
            skip = Skip(name, due, "tick_ahead", "", None, None, db_now=db_now, horizon=timedelta(0))
            return RunResult(job=name, tick=due, holder="h", outcome="skipped", skip=skip)
        if ran and due <= ran[-1][1]:  # as the lease answers: done, or a later tick claimed
            return RunResult(
                job=name,
                tick=due,
                holder="h",
                outcome="skipped",
                skip=Skip(name, due, "tick_claimed", "h", None, None),
            )
        ran.append((db_now, due))
        return RunResult(job=name, tick=due, holder="h", outcome="succeeded")

    burst = replace(HOURLY, name="burst", cron=Schedule("54-59 0 * * *"))
    Scheduler(jobs=[burst], now=clock.now, run=run, stop=clock.stop).run_forever(wait=clock.wait)

    slots = [at(0, minute) for minute in range(54, 60)]
    assert [due for _db_now, due in ran] == [at(0, 59) - timedelta(days=1), *slots]
    assert all(due <= db_now < due + timedelta(seconds=2) for db_now, due in ran[1:]), ran


def test_it_never_sleeps_more_than_a_minute_without_looking_at_the_clock():
    clock = FakeClock(at(10))
    waits = []
    scheduler = Scheduler(jobs=[HOURLY], now=clock.now, run=Runs(clock))

    def wait(seconds):
        waits.append(seconds)
        clock.wait(seconds)

    scheduler.run_forever(wait=wait, iterations=3)

    assert waits == [60, 60, 60]


def test_a_wake_with_one_due_job_among_a_thousand_computes_its_slots_only(monkeypatch):
    """Issue 36, item 5: the plans are kept in time order; a wake looks at the jobs due, not at
    every registered one (it used to compute two slots of each job at each wake)."""
    clock = FakeClock(at(10))
    runs = Runs(clock)
    hourly = [replace(HOURLY, name=f"hourly_{number}") for number in range(999)]
    half_past = replace(HOURLY, name="half_past", cron=Schedule("30 * * * *"))
    scheduler = Scheduler(jobs=[*hourly, half_past], now=clock.now, run=runs)
    scheduler.step()  # on start: the current slot of each
    assert len(runs.asked) == 1000 and scheduler.next_wake() == at(10, 1)  # MAX_SLEEP
    computed = Counter()
    for name in ("slot_at_or_before", "next_slot"):
        monkeypatch.setattr(
            schedule.Schedule, name, _counted(getattr(schedule.Schedule, name), name, computed)
        )

    clock.at = at(10, 30)
    scheduler.step()
    wake = scheduler.next_wake()

    assert runs.asked[1000:] == [(at(10, 30), at(10, 30))] and wake == at(10, 31)
    assert computed == {"slot_at_or_before": 1, "next_slot": 1}


def _counted(real, name: str, computed: Counter):
    def counted(*args, **kwargs):
        computed[name] += 1
        return real(*args, **kwargs)

    return counted


# --- against the database ------------------------------------------------------------


@pytest.fixture
def every_minute(settings, transactional_db) -> Job:
    settings.LOCKS_JOBS = {"minutely": {**RECORD, "schedule": "* * * * *"}}  # alone: each run reads them all
    return jobs()["minutely"]


def test_five_hundred_wakes_keep_memory_flat(every_minute):
    """500 slots of a real job, each a real run under the lease, on a fast fake clock: 100 to warm
    up, 100 traced (the bounded caches turn over: the entries they add are traced, the ones they
    drop were not, some 30 KiB that is no leak), then 300 measured against those 100: a leak of some
    25 bytes a wake shows (the measure's own noise is a few KiB either way)."""
    clock = FakeClock(datetime(2020, 1, 1, tzinfo=UTC))
    scheduler = Scheduler(jobs=[every_minute], now=clock.now)
    scheduler.run_forever(wait=clock.wait, iterations=100)  # warm up: imports, caches, connections
    logging.disable(logging.INFO)  # pytest keeps every captured record: not the loop's memory
    tracemalloc.start()
    try:
        scheduler.run_forever(wait=clock.wait, iterations=100)
        gc.collect()  # what is only waiting for the cycle collector is not kept
        before = tracemalloc.take_snapshot()
        scheduler.run_forever(wait=clock.wait, iterations=300)
        gc.collect()
        after = tracemalloc.take_snapshot()
    finally:
        tracemalloc.stop()
        logging.disable(logging.NOTSET)

    grown = sum(stat.size_diff for stat in after.compare_to(before, "filename"))
    assert JobRun.objects.filter(job_name="minutely", status="succeeded").count() == 500
    assert grown < 10 * 1024, [str(stat) for stat in after.compare_to(before, "lineno")[:5]]
