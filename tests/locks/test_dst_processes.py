"""Jobs read in Europe/Berlin on the DST nights of 2027, with real processes: three copies of the
scheduler asking every slot at once, on SQLite and on PostgreSQL (docs/jobs.md, "Time zones
and DST").

``nightly`` is ``30 2 * * *`` and ``hourly`` is ``0 * * * *``, both in Europe/Berlin
(tests/hostproject/settings.py, ``BERLIN_JOBS``). On 2027-03-28 (02:00 CET -> 03:00 CEST) the
nightly job runs once, at 03:00 CEST, and the hourly one 23 times; on 2027-10-31 (03:00 CEST ->
02:00 CET) the nightly job runs once, at the first 02:30 (CEST), and the hourly one 25 times.

Each copy runs under faketime with its clock (and so SQLite's) on 2027-11-01, after both nights;
PostgreSQL's server is restarted under faketime the same way (``database_clock_at``). The
scheduler's own clock steps through the nights (tests/locks/dst_worker.py), so one process
asks every slot of both nights: three processes in all, not one per slot.
"""

from __future__ import annotations

import json
import subprocess
import sys
from collections import Counter
from datetime import UTC, date, datetime
from zoneinfo import ZoneInfo

import pytest

from locks.models import JobRun
from tests.conftest import ROOT, project_env
from tests.jobsapp.models import SlotWrite
from tests.locks.conftest import faketime_or_skip, offset_to

pytestmark = pytest.mark.slow

BERLIN = ZoneInfo("Europe/Berlin")
SPRING, FALL = date(2027, 3, 28), date(2027, 10, 31)
NIGHTS = [
    ("2027-03-27T23:00:00+00:00", "2027-03-28T22:00:00+00:00"),  # 00:00 CET to 00:00 CEST
    ("2027-10-30T22:00:00+00:00", "2027-10-31T23:00:00+00:00"),  # 00:00 CEST to 00:00 CET
]
AFTER_BOTH = datetime(2027, 11, 1, 12, 0, tzinfo=UTC)
COPIES = 3


def on(day: date, job: str) -> list[datetime]:
    """The ticks of ``job``'s writes on the Berlin date ``day``, oldest first."""
    ticks = SlotWrite.objects.filter(job=job).order_by("tick").values_list("tick", flat=True)
    return [tick for tick in ticks if tick.astimezone(BERLIN).date() == day]


def test_three_copies_run_each_berlin_slot_once_on_both_dst_nights(db_url, database_clock_at, tmp_path):
    faketime = faketime_or_skip()
    database_clock_at(AFTER_BOTH)
    go = tmp_path / "go"
    go.mkdir()
    env = project_env(
        DATABASE_URL=db_url,
        DJANGO_SETTINGS_MODULE="tests.hostproject.settings",
        BERLIN_JOBS="1",
        HOSTPROJECT_JOBS="nightly hourly",
        TZ="Europe/Berlin",
        LOCKS_LOG_LEVEL="WARNING",
    )
    nights = [arg for night in NIGHTS for arg in ("--night", *night)]
    worker = [
        sys.executable,
        "-m",
        "tests.locks.dst_worker",
        "--go",
        str(go),
        "--copies",
        str(COPIES),
        *nights,
    ]
    copies = [
        subprocess.Popen(
            [faketime, "-f", offset_to(AFTER_BOTH), *worker, "--copy", str(n)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for n in range(COPIES)
    ]
    outputs = [copy.communicate(timeout=300) for copy in copies]

    for copy, (_out, err) in zip(copies, outputs, strict=True):
        assert copy.returncode == 0, err
        assert "Traceback" not in err, err
    asked = [ask for out, _err in outputs for ask in json.loads(out)]

    # 30 2 * * *: once a night, at 03:00 CEST after the gap, at the first 02:30 when it repeats.
    assert on(SPRING, "nightly") == [datetime(2027, 3, 28, 1, 0, tzinfo=UTC)]
    assert on(FALL, "nightly") == [datetime(2027, 10, 31, 0, 30, tzinfo=UTC)]
    # 0 * * * *: every real hour of the day.
    assert len(on(SPRING, "hourly")) == 23
    assert len(on(FALL, "hourly")) == 25
    assert [t.astimezone(BERLIN).strftime("%H%Z") for t in on(FALL, "hourly")][1:5] == [
        "01CEST",
        "02CEST",
        "02CET",
        "03CET",
    ]
    # Each slot ran once, however many copies asked: one write and one succeeded run per slot.
    writes = Counter(SlotWrite.objects.values_list("job", "tick"))
    assert set(writes.values()) == {1}, writes
    runs = Counter(JobRun.objects.filter(status="succeeded").values_list("job_name", "tick"))
    assert runs == writes
    ran = Counter((ask["job"], ask["tick"]) for ask in asked if ask["outcome"] == "succeeded")
    assert set(ran.values()) == {1} and len(ran) == len(writes)
    # Every copy asked every slot (and again while another copy held it): the others skipped it.
    for out, _err in outputs:
        assert {(ask["job"], datetime.fromisoformat(ask["tick"])) for ask in json.loads(out)} == set(writes)
