"""Three ``run_scheduler`` processes, one SIGKILLed while it runs a tick: every slot runs once.

The host project's ``slow_write`` runs every 10 seconds (a seconds-level cron schedule, so
that a dozen slots pass in two minutes of real time) and works 2 s before its fenced write,
so that the process killed is killed in the middle of a run. Its tick is taken over by
another scheduler once the dead holder's lease (3 s) has expired, within the same slot.
"""

from __future__ import annotations

import signal
import socket
import subprocess
import time
from collections import Counter
from datetime import timedelta

import pytest

from locks.models import JobRun, SyncLock, database_now
from locks.schedule import next_tick, slot_at_or_before
from tests.conftest import ROOT, project_env, spawn
from tests.locks.conftest import wait_for

SCHEDULE = "* * * * * */10"  # croniter's sixth field: seconds
SLOTS = 7
GRACE = 5


def start(env: dict[str, str], job: str = "slow_write") -> subprocess.Popen:
    return spawn([str(ROOT / "manage.py"), "run_scheduler", job], env=env)


@pytest.mark.slow
def test_three_schedulers_one_killed_run_every_slot_exactly_once(db_url):
    env = project_env(
        DATABASE_URL=db_url,
        SLOW_WRITE_SCHEDULE=SCHEDULE,
        SLOW_WRITE_TTL="3",
        SLOW_WRITE_SECONDS="2",
        LOCKS_SCHEDULER_GRACE=str(GRACE),
    )
    schedulers = [start(env) for _ in range(3)]
    try:
        first = next_tick(SCHEDULE, now=database_now())
        # Kill whichever scheduler is in the middle of the third slot's run.
        victim_slot = first + timedelta(seconds=20)
        # Its run's row, not only its lease: killed between the two, it would leave no run to close.
        running = JobRun.objects.filter(job_name="slow_write", tick=victim_slot, status="running")
        wait_for(running.exists, timeout=60, what="a scheduler to start the third slot's run")
        holder = running.get().holder
        victim = next(proc for proc in schedulers if f":{proc.pid}:" in holder)
        victim.send_signal(signal.SIGKILL)
        last = first + timedelta(seconds=10 * (SLOTS - 1))
        wait_for(
            lambda: JobRun.objects.filter(job_name="slow_write", tick=last, status="succeeded").exists(),
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
        JobRun.objects.filter(job_name="slow_write", status="succeeded").values_list("tick", flat=True)
    )
    slots = [first + timedelta(seconds=10 * index) for index in range(SLOTS)]
    assert [succeeded[slot] for slot in slots] == [1] * SLOTS, succeeded
    assert max(succeeded.values()) == 1  # no tick twice, in the slots before and after either
    assert all(slot_at_or_before(SCHEDULE, now=tick) == tick for tick in succeeded)
    # The killed run is closed as abandoned by the run that took its tick over.
    killed = JobRun.objects.get(job_name="slow_write", tick=victim_slot, holder=holder)
    assert killed.status == "abandoned", (killed.status, killed.error)
    # The others skipped and said why.
    skips = [
        line
        for _out, err in outputs
        for line in err.splitlines()
        if " holder=" in line and "outcome=skipped" in line
    ]
    assert skips and all(" reason=" in line for line in skips), skips


@pytest.mark.slow
def test_an_unreachable_database_is_one_warning_a_tick_and_the_loop_goes_on():
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    env = project_env(
        DATABASE_URL=f"postgres://nobody@127.0.0.1:{port}/contests", SLOW_WRITE_SCHEDULE="* * * * * */2"
    )
    scheduler = start(env)
    time.sleep(7)  # three or four slots of two seconds
    scheduler.send_signal(signal.SIGTERM)
    _out, err = scheduler.communicate(timeout=30)

    assert scheduler.returncode == 0, err
    assert "Traceback" not in err
    warnings = [line for line in err.splitlines() if " WARNING " in line]
    ticks = [line.split(" tick=", 1)[1].split()[0] for line in warnings]
    assert len(ticks) >= 2 and len(set(ticks)) == len(ticks), warnings  # one per tick, on and on
    assert all("outcome=skipped reason=database unreachable" in line for line in warnings)


@pytest.mark.slow
def test_sigterm_gives_a_running_job_its_grace_then_records_it_and_releases_the_lease(db_url):
    env = project_env(DATABASE_URL=db_url, LOCKS_SCHEDULER_GRACE="1")
    scheduler = start(env, "linger")
    try:
        # On start it catches up the current slot of linger's schedule: a job that sleeps.
        wait_for(
            lambda: JobRun.objects.filter(job_name="linger", status="running").exists(),
            timeout=30,
            what="the scheduler to start linger",
        )
        scheduler.send_signal(signal.SIGTERM)
        began = time.monotonic()
        _out, err = scheduler.communicate(timeout=30)
        stopped_after = time.monotonic() - began
    finally:
        if scheduler.poll() is None:
            scheduler.kill()
            scheduler.communicate()

    assert scheduler.returncode == 0, err
    assert stopped_after < 10  # the 1 s grace, not the job's 60 s
    assert "scheduler: SIGTERM received; job=linger may finish within 1 s" in err
    run = JobRun.objects.get(job_name="linger")
    assert (run.status, run.error) == ("failed", "interrupted: SystemExit: 0")
    assert SyncLock.objects.get(job_name="linger").locked_until is None  # released, not left to expire
    assert "Traceback" not in err
