"""The catch-up policy of a job (docs/architecture.md, "The rules": 13, and "Catch-up").

``latest`` (the default): a slot that has not succeeded when the next one comes is superseded
and missed. ``all``: every slot within ``catch_up_window`` runs exactly once, oldest first, even
after later slots came; a new job starts at its current slot. Past slots by rows written into
the past (the lock row's claimed tick), runs for real against the database.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.db import OperationalError, connection

from locks import schedule
from locks.models import SyncLock, database_now
from locks.registry import get_job
from locks.runner import run_due, run_job
from locks.schedule import InvalidTick, Schedule
from tests.jobsapp.models import SlotWrite
from tests.locks.conftest import register

HOURLY = "0 * * * *"


def at(hour: int, minute: int = 0) -> datetime:
    return datetime(2026, 12, 2, hour, minute, tzinfo=UTC)


@pytest.mark.parametrize(
    ("claimed", "settled", "due", "oldest", "expected"),
    [
        (at(7), True, at(10), at(0), at(8)),  # done: the slot after it
        (at(7), False, at(10), at(0), at(7)),  # not done, attempts left: that one again
        (at(7), False, at(10), at(8, 30), at(9)),  # older than the window: its first slot
        (at(7), True, at(10), at(8, 30), at(9)),
        (at(10), True, at(10), at(0), at(10)),  # nothing behind: the slot of now (the lease says done)
        (at(11), False, at(10), at(0), at(10)),  # a later tick claimed (a fast host): the lease says so
        (at(7), True, at(10), at(9), at(9)),  # a window that starts on a slot includes it
    ],
)
def test_the_slot_a_run_claims_under_all(claimed, settled, due, oldest, expected):
    assert Schedule(HOURLY).pending(claimed=claimed, settled=settled, due=due, oldest=oldest) == expected


@pytest.fixture
def hourly(settings, transactional_db):
    """``hourly(**entry)``: an hourly job that writes one SlotWrite row per slot; its current slot."""

    def make(**entry) -> datetime:
        register(
            settings,
            hourly={"schedule": HOURLY, "callable": "tests.jobsapp.jobs.write_slot", "ttl": 60, **entry},
        )
        return get_job("hourly").current_tick()

    return make


def done_at(tick: datetime) -> None:
    """The job's last claimed tick is ``tick``, and it succeeded."""
    SyncLock.objects.update_or_create(job_name="hourly", defaults={"tick": tick, "tick_done": True})


def written() -> list[datetime]:
    return list(SlotWrite.objects.order_by("id").values_list("tick", flat=True))


def test_under_all_every_slot_behind_runs_once_oldest_first_even_after_later_slots_came(hourly):
    now = hourly(catch_up="all")
    done_at(now - timedelta(hours=3))

    results = list(run_due(name="hourly"))

    behind = [now - timedelta(hours=2), now - timedelta(hours=1)]
    assert [(r.tick, r.outcome, r.claimed == "behind") for r in results] == [
        (behind[0], "succeeded", True),
        (behind[1], "succeeded", True),
        (now, "succeeded", False),
    ]
    assert written() == [*behind, now]
    again = run_job(name="hourly")
    assert (again.tick, again.skip.reason) == (now, "tick_claimed")
    assert len(written()) == 3


def test_under_latest_a_slot_superseded_by_the_next_is_missed(hourly):
    now = hourly()  # catch_up "latest", the default
    done_at(now - timedelta(hours=3))

    results = list(run_due(name="hourly"))

    assert [(r.tick, r.outcome) for r in results] == [(now, "succeeded")]
    assert written() == [now]


def test_run_job_runs_each_slot_behind_and_prints_a_line_for_each(hourly):
    now = hourly(catch_up="all")
    done_at(now - timedelta(hours=2))
    out = StringIO()

    call_command("run_job", "hourly", stdout=out)

    lines = out.getvalue().splitlines()
    assert [line.split()[1] for line in lines] == [
        f"tick={(now - timedelta(hours=1)).isoformat()}",
        f"tick={now.isoformat()}",
    ]
    assert all(" outcome=succeeded " in line for line in lines)


def test_a_crontab_pass_runs_each_slot_behind_up_to_the_slot_it_claimed_and_no_later(hourly):
    """The pass's child (``locks.crontab.run``) names the slot its pass claimed: under "all" the slots
    behind it run first, as for ``run_job NAME``; never the slot of now, which its pass did not claim."""
    now = hourly(catch_up="all")
    done_at(now - timedelta(hours=3))
    claimed = now - timedelta(hours=1)
    out = StringIO()

    call_command("run_job", "hourly", slot=claimed, requested_by="cron", stdout=out)

    assert [line.split()[1] for line in out.getvalue().splitlines()] == [
        f"tick={(now - timedelta(hours=2)).isoformat()}",
        f"tick={claimed.isoformat()}",
    ]
    assert written() == [now - timedelta(hours=2), claimed]


def test_the_window_bounds_how_far_back_all_goes(hourly):
    now = hourly(catch_up="all", catch_up_window=7200)
    done_at(now - timedelta(hours=6))
    oldest = database_now() - timedelta(hours=2)

    results = list(run_due(name="hourly"))

    first = (
        oldest if schedule.Schedule(HOURLY).is_slot(oldest) else schedule.Schedule(HOURLY).next_slot(oldest)
    )
    expected = [first + timedelta(hours=n) for n in range(int((now - first) / timedelta(hours=1)) + 1)]
    assert [r.tick for r in results] == expected and len(expected) in {2, 3}
    assert written() == expected


def test_a_new_job_starts_at_its_current_slot(hourly):
    now = hourly(catch_up="all")

    results = list(run_due(name="hourly"))

    assert [(r.tick, r.outcome) for r in results] == [(now, "succeeded")]  # no day of history


def test_a_slot_that_had_its_attempts_is_passed_over(hourly):
    now = hourly(catch_up="all")  # no retry delays: one attempt a tick
    SyncLock.objects.create(
        job_name="hourly", tick=now - timedelta(hours=1), tick_done=False, tick_attempts=1
    )

    results = list(run_due(name="hourly"))

    assert [(r.tick, r.outcome) for r in results] == [(now, "succeeded")]


def test_a_slot_waiting_for_its_retry_holds_back_the_later_ones(hourly):
    now = hourly(catch_up="all", retry={"delays": [600]})
    retry_at = database_now() + timedelta(minutes=5)
    SyncLock.objects.create(
        job_name="hourly", tick=now - timedelta(hours=1), tick_done=False, tick_attempts=1, retry_at=retry_at
    )

    [result] = run_due(name="hourly")

    assert (result.tick, result.skip.reason, result.skip.retry_at) == (
        now - timedelta(hours=1),
        "retry_later",
        retry_at,
    )
    assert written() == []


def test_a_tick_that_would_skip_slots_is_refused_under_all(hourly):
    now = hourly(catch_up="all")
    done_at(now - timedelta(hours=2))

    with pytest.raises(InvalidTick) as refused:
        run_job(name="hourly", tick=now)

    assert str(refused.value) == (
        f"tick {now.isoformat()} would skip slots: under catch_up 'all' the slots of hourly run oldest first, "
        f"and the next one is {(now - timedelta(hours=1)).isoformat()}"
    )
    assert written() == []
    assert run_job(name="hourly", tick=now - timedelta(hours=1)).outcome == "succeeded"


def test_a_forced_run_that_cannot_read_its_pending_slot_says_it_was_forced(hourly, caplog):
    """Under catch_up "all" a forced run reads the oldest slot still to run first; when that read
    fails it is skipped as unreachable. Was: its result and log line named that slot and not forced
    (the trigger's JSON said "forced": false)."""
    hourly(catch_up="all")

    def unreachable(execute, sql, params, many, context):
        raise OperationalError("could not connect to server")

    with connection.execute_wrapper(unreachable):
        result = run_job(name="hourly", force=True)

    assert (result.outcome, result.tick, result.claimed) == ("unreachable", None, "forced")
    assert "job=hourly tick=forced " in caplog.text
