"""Hosts whose clocks are wrong (Debian's faketime) against one PostgreSQL server.

SQLite has no clock of its own: its "now" is each process's clock, so skew
between host and database cannot exist there and these run on PostgreSQL only.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from contests.models import Contest, Reminder
from locks.models import JobRun, database_now
from tests.contests.reminder_data import make_reminder, make_user
from tests.standin import load_fixture

SKEW_WARNING = re.compile(r"host clock is ([+-]\d+) s off the database clock \(more than (\d+) s\)")
OFFSETS = {"+7m": 420, "-7m": -420, "+0": 0}


def skew_warnings(stderr: str) -> list[int]:
    return [int(found.group(1)) for found in SKEW_WARNING.finditer(stderr)]


@pytest.mark.slow
@pytest.mark.scenario("clock-skew-16")
def test_sixteen_skewed_processes_sync_once(postgres, faketime, fault_env, procs, observe):
    # A slot in this very minute, whatever the time of day the test runs at. A clock
    # 7 minutes fast or right is past it and names it; a clock 7 minutes slow has it
    # further ahead than the 5-minute tick window and names the slot before it, an
    # hour earlier (a catch-up of that slot, refused once the later slot is claimed).
    now = datetime.now(UTC)
    slot = now.replace(second=0, microsecond=0)
    expected_tick = {"+7m": slot, "+0": slot, "-7m": slot - timedelta(hours=1)}
    env = fault_env(SYNC_CONTESTS_SCHEDULE=f"{now.minute} * * * *", SYNC_CONTESTS_LOCK_TTL="60")
    offsets = [list(OFFSETS)[index % 3] for index in range(16)]

    copies = [
        (
            offset,
            procs.manage("sync_contests", env=env, prefix=(faketime, "-f", offset), name=f"clock {offset}"),
        )
        for offset in offsets
    ]
    for _offset, copy in copies:
        assert copy.wait(timeout=180) == 0, copy.transcript()

    for offset, copy in copies:
        assert copy.result()["tick"] == expected_tick[offset].isoformat(), copy.transcript()
    outcomes = Counter(copy.result()["outcome"] for _offset, copy in copies)
    assert set(outcomes) <= {"succeeded", "skipped"}
    assert 1 <= outcomes["succeeded"] <= 2, outcomes  # at most once per named tick
    for offset, copy in copies:
        assert "Traceback" not in copy.stderr, copy.transcript()
        seen = skew_warnings(copy.stderr)
        if OFFSETS[offset] == 0:
            assert seen == [], copy.transcript()
        else:
            assert seen, copy.transcript()
            assert all(abs(skew - OFFSETS[offset]) < 30 for skew in seen), copy.transcript()
    runs = Counter(JobRun.objects.values_list("tick", flat=True))
    assert set(runs) <= {slot, slot - timedelta(hours=1)}
    assert all(count == 1 for count in runs.values()), runs  # never a tick twice
    assert JobRun.objects.count() == outcomes["succeeded"]
    assert Contest.objects.count() == 1758
    winners = sorted(offset for offset, copy in copies if copy.result()["outcome"] == "succeeded")
    counts = Counter(offsets)
    observe(
        f"{counts['+7m']} fast, {counts['-7m']} slow, {counts['+0']} right: {len(winners)} sync(s) "
        f"(clocks {', '.join(winners)}), {16 - len(winners)} skips; fast and right name the slot of now, "
        f"slow the slot before; no tick twice; {counts['+7m'] + counts['-7m']} skewed processes warned, "
        "0 right ones"
    )


@pytest.mark.slow
@pytest.mark.scenario("clock-skew-40")
def test_host_forty_minutes_off_is_detected(postgres, faketime, fault_env, procs, observe):
    copy = procs.manage("sync_contests", env=fault_env(), prefix=(faketime, "-f", "-40m"), name="slow host")

    assert copy.wait(timeout=60) == 0, copy.transcript()
    assert "Traceback" not in copy.stderr
    found = SKEW_WARNING.search(copy.stderr)
    assert found, copy.transcript()
    skew, limit = int(found.group(1)), int(found.group(2))
    assert abs(skew - -2400) < 30
    assert limit == 120
    (line,) = [line for line in copy.stderr.splitlines() if "host clock is" in line]
    assert " WARNING " in line
    assert "job=sync_contests" in line
    observe(
        f"WARNING `job=sync_contests host clock is {skew} s off the database clock "
        f"(more than {limit} s)`; exit 0"
    )


@pytest.mark.slow
@pytest.mark.scenario("prune-host-fast")
def test_a_host_100_s_fast_keeps_a_reminder_whose_contest_starts_in_90_s(
    postgres, faketime, fault_env, standin, procs, observe
):
    """Issue 17, reproduction 8: the sync's prune judged "started" by the host clock, so a host
    100 s fast deleted the reminder of a contest that starts in 90 s by the database clock, and
    the email was never sent. The database clock judges it now."""
    start = (database_now() + timedelta(seconds=90)).replace(microsecond=0)
    payload = load_fixture()
    entry = payload["result"][0]
    entry.update(phase="BEFORE", startTimeSeconds=int(start.timestamp()))
    standin.set_payload(payload)
    env = fault_env()
    first = procs.manage("sync_contests", "--force", env=env, name="right clock")
    assert first.wait(timeout=120) == 0, first.transcript()
    contest = Contest.objects.get(contest_id=entry["id"])
    assert contest.start_time == start
    reminder = make_reminder(make_user("ada"), contest, at=timedelta(seconds=60))

    fast = procs.manage("sync_contests", "--force", env=env, prefix=(faketime, "-f", "+100s"), name="fast")

    assert fast.wait(timeout=120) == 0, fast.transcript()
    assert "Traceback" not in fast.stderr
    assert fast.result()["outcome"] == "succeeded" and fast.field("pruned") == "0", fast.transcript()
    assert Reminder.objects.filter(pk=reminder.pk).exists()
    contest.start_time = database_now() - timedelta(seconds=1)  # it started, by the database clock
    contest.save(update_fields=["start_time"])
    entry["startTimeSeconds"] = int(contest.start_time.timestamp())
    standin.set_payload(payload)
    after = procs.manage("sync_contests", "--force", env=env, name="after the start")
    assert after.wait(timeout=120) == 0, after.transcript()
    assert not Reminder.objects.filter(pk=reminder.pk).exists()
    observe(
        "host +100 s, the contest 90 s away by the database clock: exit 0, succeeded, pruned=0, the reminder "
        f"kept; after the start: pruned={after.field('pruned')}, the reminder gone"
    )
