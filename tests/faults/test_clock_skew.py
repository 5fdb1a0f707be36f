"""Hosts whose clocks are wrong (Debian's faketime) against one PostgreSQL server.

SQLite has no clock of its own: its "now" is each process's clock, so skew
between host and database cannot exist there and these run on PostgreSQL only.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest

from contests.models import Contest
from locks.models import JobRun

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
