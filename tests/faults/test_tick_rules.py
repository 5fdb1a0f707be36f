"""Which tick a run claims, and when it may claim one again: real `sync_contests`
processes under faketime.

Runs meant to happen at some time of day are faked to that time *yesterday*
(UTC): on PostgreSQL the database clock stays real, and a tick in the past is
never ahead of it. The host-versus-database skew those runs show there is the
test's doing, so ``LOCKS_MAX_CLOCK_SKEW`` is raised past it and every run can be
held to "no WARNING line".
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta

import pytest
from django.db.models import F

from contests.models import Contest
from locks import schedule
from locks.models import JobRun, SyncLock

HOURLY = "0 * * * *"
WINDOW = 300
SKEW_ALLOWED = str(3 * 86400)  # the faked runs lie up to two days behind the real database clock
OFFSET = re.compile(r"this host's clock is ([+-]\d+) s off the database clock")


def lines(text: str, level: str) -> list[str]:
    return [line for line in text.splitlines() if f" {level} " in line]


def yesterday_at(hour: int, minute: int, second: int = 0) -> datetime:
    day = datetime.now(UTC).date() - timedelta(days=1)
    return datetime(day.year, day.month, day.day, hour, minute, second, tzinfo=UTC)


def at(faketime: str, moment: datetime) -> tuple[str, ...]:
    # The faked start is read in the wrapper's time zone: the env sets TZ=UTC.
    return (faketime, "-f", f"@{moment:%Y-%m-%d %H:%M:%S}")


def run(procs, env, *, prefix: tuple[str, ...] = (), name: str):
    copy = procs.manage("sync_contests", env=env, prefix=prefix, name=name)
    code = copy.wait(timeout=60)
    assert "Traceback" not in copy.stderr, copy.transcript()
    return copy, code


def ticks_and_statuses() -> list[tuple[datetime, str]]:
    return list(JobRun.objects.order_by("token").values_list("tick", "status"))


@pytest.mark.slow
@pytest.mark.scenario("between-slots")
def test_a_run_between_slots_leaves_the_next_slot_to_its_run(faketime, fault_env, standin, procs, observe):
    env = fault_env(
        SYNC_CONTESTS_SCHEDULE=HOURLY,
        LOCKS_TICK_WINDOW=str(WINDOW),
        LOCKS_MAX_CLOCK_SKEW=SKEW_ALLOWED,
        TZ="UTC",
    )
    manual_at, scheduled_at = yesterday_at(7, 37), yesterday_at(8, 0, 5)
    seven, eight = yesterday_at(7, 0), yesterday_at(8, 0)

    manual, manual_code = run(procs, env, prefix=at(faketime, manual_at), name="run at :37")
    scheduled, scheduled_code = run(procs, env, prefix=at(faketime, scheduled_at), name="run at :00")

    for copy, code in ((manual, manual_code), (scheduled, scheduled_code)):
        assert code == 0, copy.transcript()
        assert copy.result()["outcome"] == "succeeded", copy.transcript()
        assert not lines(copy.stderr, "WARNING") and not lines(copy.stderr, "ERROR"), copy.transcript()
    # 08:00 was 23 minutes ahead of the :37 run, beyond the 5 min window: it named 07:00.
    assert manual.result()["tick"] == seven.isoformat(), manual.transcript()
    assert scheduled.result()["tick"] == eight.isoformat(), scheduled.transcript()
    assert (manual.field("created"), scheduled.field("unchanged")) == ("1758", "1758")
    assert ticks_and_statuses() == [(seven, "succeeded"), (eight, "succeeded")]
    assert standin.calls == 2
    assert Contest.objects.count() == 1758
    observe(
        f"run at {manual_at:%H:%M:%S}: tick {seven:%H:%M}, exit 0, succeeded (created="
        f"{manual.field('created')}); run at {scheduled_at:%H:%M:%S}: tick {eight:%H:%M}, exit 0, "
        f"succeeded (unchanged={scheduled.field('unchanged')}); 2 JobRuns, {standin.calls} API calls, "
        "no WARNING"
    )


@pytest.mark.slow
@pytest.mark.scenario("host-a-day-fast")
def test_a_host_a_day_fast_is_refused_and_the_others_sync(
    postgres, faketime, fault_env, standin, procs, observe
):
    env = fault_env(SYNC_CONTESTS_SCHEDULE=HOURLY, LOCKS_TICK_WINDOW=str(WINDOW))
    fast = (faketime, "-f", "+1d")
    window = timedelta(seconds=WINDOW)

    first, first_code = run(procs, env, prefix=fast, name="a day fast")
    assert first_code == 0, first.transcript()
    assert first.result()["outcome"] == "skipped", first.transcript()
    [warning] = lines(first.stderr, "WARNING")  # the refusal; no separate skew warning
    assert "ahead of the database clock" in warning, first.transcript()
    offset = int(OFFSET.search(warning).group(1))
    assert abs(offset - 86400) < 60, warning
    assert not lines(first.stderr, "ERROR")
    assert not SyncLock.objects.exists()  # refused before the job's row was even inserted
    assert not JobRun.objects.exists()
    assert standin.calls == 0

    before = schedule.Schedule(HOURLY).current(datetime.now(UTC), window=window)
    right, right_code = run(procs, env, name="right clock")
    after = schedule.Schedule(HOURLY).current(datetime.now(UTC), window=window)
    assert right_code == 0, right.transcript()
    assert right.result()["outcome"] == "succeeded", right.transcript()
    tick = datetime.fromisoformat(right.result()["tick"])
    assert tick in {before, after}, right.transcript()
    assert right.field("created") == "1758"
    assert not lines(right.stderr, "WARNING"), right.transcript()
    claimed = SyncLock.objects.values_list("tick", "tick_done", "token").get()

    again, again_code = run(procs, env, prefix=fast, name="a day fast, again")
    assert again_code == 0, again.transcript()
    assert again.result()["outcome"] == "skipped", again.transcript()
    [warning_again] = lines(again.stderr, "WARNING")
    assert abs(int(OFFSET.search(warning_again).group(1)) - 86400) < 60, warning_again
    assert SyncLock.objects.values_list("tick", "tick_done", "token").get() == claimed == (tick, True, 1)
    assert ticks_and_statuses() == [(tick, "succeeded")]
    assert standin.calls == 1
    observe(
        f"host +1d: exit 0, skipped, one WARNING `… ahead of the database clock …; this host's clock is "
        f"{offset:+d} s off the database clock`, nothing stored (no lock row, no JobRun); right clock: "
        f"exit 0, succeeded tick {tick:%H:%M}, created={right.field('created')}; host +1d again: "
        "refused the same way, the stored tick unchanged"
    )


@pytest.mark.slow
@pytest.mark.scenario("codeforces-down-at-slot")
def test_a_failed_tick_is_run_again_later_in_its_hour(faketime, fault_env, standin, procs, observe):
    env = fault_env(
        SYNC_CONTESTS_SCHEDULE=HOURLY,
        LOCKS_TICK_WINDOW=str(WINDOW),
        LOCKS_MAX_CLOCK_SKEW=SKEW_ALLOWED,
        CODEFORCES_MAX_ATTEMPTS="3",
        TZ="UTC",
    )
    tick = yesterday_at(7, 0)
    # Codeforces is down for every attempt of the :00 run, then answers again.
    standin.queue = [(503, b"Service Unavailable")] * 3

    down, down_code = run(procs, env, prefix=at(faketime, yesterday_at(7, 0, 5)), name="run at :00")
    assert down_code == 1, down.transcript()
    assert (down.result()["tick"], down.result()["outcome"]) == (tick.isoformat(), "failed"), (
        down.transcript()
    )
    [error] = lines(down.stderr, "ERROR")
    assert "HTTP 503" in error and "(3 attempts)" in error, down.transcript()
    assert standin.queue == [] and standin.calls == 3
    refused = standin.calls
    assert not Contest.objects.exists()
    assert SyncLock.objects.values_list("tick", "tick_done", "locked_until").get() == (tick, False, None)

    # Attempts are counted on the lock row and their delays judged by the database clock
    # (rule 12), which faketime does not move on PostgreSQL: put the next attempt's start
    # where it stands 20 minutes later.
    SyncLock.objects.update(retry_at=F("retry_at") - timedelta(minutes=20))
    later, later_code = run(procs, env, prefix=at(faketime, yesterday_at(7, 20)), name="run at :20")
    assert later_code == 0, later.transcript()
    assert later.result()["tick"] == tick.isoformat(), later.transcript()
    assert later.result()["outcome"] == "succeeded", later.transcript()
    assert later.field("created") == "1758"
    assert not lines(later.stderr, "WARNING") and not lines(later.stderr, "ERROR"), later.transcript()

    last, last_code = run(procs, env, prefix=at(faketime, yesterday_at(7, 40)), name="run at :40")
    assert last_code == 0, last.transcript()
    assert last.result()["tick"] == tick.isoformat(), last.transcript()
    assert last.result()["outcome"] == "skipped", last.transcript()
    assert f"tick {tick.isoformat()} already done by" in last.stdout, last.transcript()

    assert ticks_and_statuses() == [(tick, "failed"), (tick, "succeeded")]
    assert standin.calls == 4
    assert Contest.objects.count() == 1758
    observe(
        f"run at 07:00:05: {refused} attempts answered HTTP 503, exit 1, failed, one ERROR line, 0 rows; "
        f"run at 07:20: tick {tick:%H:%M} claimed again, exit 0, succeeded, created={later.field('created')}; "
        "run at 07:40: exit 0, skipped `already done`; JobRuns for that tick: failed, succeeded"
    )
