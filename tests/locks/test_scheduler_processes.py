"""Three ``run_scheduler`` processes, one SIGKILLed while it runs a tick: every slot runs once.

The sync runs every 10 seconds (a seconds-level cron schedule, so that a dozen slots pass
in two minutes of real time) against the local stand-in, which takes 2 s to answer, so
that the process killed is killed in the middle of a run. Its tick is taken over by
another scheduler once the dead holder's lease (3 s) has expired, within the same slot.
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta

import pytest

from locks.clock import database_now
from locks.models import JobRun, SyncLock
from locks.schedule import next_tick, slot_at_or_before
from tests.conftest import ROOT, project_env

SCHEDULE = "* * * * * */10"  # croniter's sixth field: seconds
SLOTS = 7
GRACE = 5


def start(env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "run_scheduler", "sync_contests"],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def wait_for(condition, *, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@pytest.mark.slow
def test_three_schedulers_one_killed_run_every_slot_exactly_once(db_url, standin):
    standin.delay = 2.0
    env = project_env(
        DATABASE_URL=db_url,
        CODEFORCES_API_URL=standin.url,
        SYNC_CONTESTS_SCHEDULE=SCHEDULE,
        SYNC_CONTESTS_LOCK_TTL="3",
        LOCKS_SCHEDULER_GRACE=str(GRACE),
    )
    schedulers = [start(env) for _ in range(3)]
    try:
        first = next_tick(SCHEDULE, now=database_now())
        # Kill whichever scheduler is in the middle of the third slot's run.
        victim_slot = first + timedelta(seconds=20)
        wait_for(
            lambda: SyncLock.objects.filter(
                job_name="sync_contests", tick=victim_slot, locked_until__isnull=False
            ).exists(),
            timeout=60,
            what="a scheduler to take the third slot",
        )
        holder = SyncLock.objects.get(job_name="sync_contests").holder
        victim = next(proc for proc in schedulers if f":{proc.pid}:" in holder)
        victim.send_signal(signal.SIGKILL)
        last = first + timedelta(seconds=10 * (SLOTS - 1))
        wait_for(
            lambda: JobRun.objects.filter(job_name="sync_contests", tick=last, status="succeeded").exists(),
            timeout=120,
            what=f"slot {last.isoformat()} to succeed",
        )
        survivors = [proc for proc in schedulers if proc is not victim]
        for proc in survivors:
            proc.send_signal(signal.SIGTERM)
        began = time.monotonic()
        outputs = [proc.communicate(timeout=GRACE + 30) for proc in survivors]
        stopped_within = time.monotonic() - began
    finally:
        for proc in schedulers:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()

    assert victim.wait() == -signal.SIGKILL
    assert [proc.returncode for proc in survivors] == [0, 0], [err for _out, err in outputs]
    assert stopped_within < GRACE + 10
    for _out, err in outputs:
        assert "Traceback" not in err, err
        assert "scheduler: stopped" in err
    succeeded = Counter(
        JobRun.objects.filter(job_name="sync_contests", status="succeeded").values_list("tick", flat=True)
    )
    slots = [first + timedelta(seconds=10 * index) for index in range(SLOTS)]
    assert [succeeded[slot] for slot in slots] == [1] * SLOTS, succeeded
    assert max(succeeded.values()) == 1  # no tick twice, in the slots before and after either
    assert all(slot_at_or_before(SCHEDULE, now=tick) == tick for tick in succeeded)
    # The killed run is closed as abandoned by the run that took its tick over.
    killed = JobRun.objects.get(job_name="sync_contests", tick=victim_slot, holder=holder)
    assert killed.status == "abandoned", (killed.status, killed.error)
    # The others skipped and said why.
    skips = [
        line
        for _out, err in outputs
        for line in err.splitlines()
        if " holder=" in line and "outcome=skipped" in line
    ]
    assert skips and all(" reason=" in line for line in skips), skips
