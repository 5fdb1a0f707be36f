"""Hosts whose clocks are wrong (Debian's faketime) against one PostgreSQL server.

SQLite has no clock of its own: its "now" is each process's clock, so skew
between host and database cannot exist there and these run on PostgreSQL only.
"""

from __future__ import annotations

import re
from collections import Counter
from datetime import UTC, datetime

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
    # A slot in this very minute: a clock 7 minutes fast or slow still names it as the
    # nearest one, whatever the time of day the test runs at.
    now = datetime.now(UTC)
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

    outcomes = Counter(copy.result()["outcome"] for _offset, copy in copies)
    assert outcomes == {"succeeded": 1, "skipped": 15}
    ticks = {copy.result()["tick"] for _offset, copy in copies}
    assert ticks == {now.replace(second=0, microsecond=0).isoformat()}
    for offset, copy in copies:
        assert "Traceback" not in copy.stderr, copy.transcript()
        seen = skew_warnings(copy.stderr)
        if OFFSETS[offset] == 0:
            assert seen == [], copy.transcript()
        else:
            assert seen, copy.transcript()
            assert all(abs(skew - OFFSETS[offset]) < 30 for skew in seen), copy.transcript()
    assert JobRun.objects.count() == 1
    assert Contest.objects.count() == 1758
    winner = next(offset for offset, copy in copies if copy.result()["outcome"] == "succeeded")
    counts = Counter(offsets)
    observe(
        f"{counts['+7m']} fast, {counts['-7m']} slow, {counts['+0']} right: 1 sync (by a {winner} clock), "
        f"15 skips, 1 tick named by all; {counts['+7m'] + counts['-7m']} skewed processes warned, "
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
