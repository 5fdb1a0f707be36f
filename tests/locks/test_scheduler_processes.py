"""``run_scheduler`` as real processes, each ask in a child process of its own.

Three schedulers, one SIGKILLed (with the run it had started) while it runs a tick: every
slot runs once (two slots before the kill, its slot and the one after). The host project's
``slow_write`` runs every 10 seconds (a seconds-level cron schedule, so that the slots pass in
seconds of real time) and works 2 s before its fenced write, so that the process killed is
killed in the middle of a run. Its tick is taken
over by another scheduler once the dead holder's lease (3 s) has expired, within the same slot:
the dead holder used the tick's first attempt, its retry delay (1 s) gives it a second.
One scheduler with two jobs: a long run of one, or its lock row locked by a write in
progress, never keeps the other's slots from running (issue 17, reproduction 7).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from collections import Counter
from datetime import timedelta
from itertools import pairwise
from pathlib import Path

import pytest

from locks.models import JobRun, SyncLock, database_now
from locks.schedule import Schedule
from tests.conftest import ROOT, project_env, spawn
from tests.locks.conftest import wait_for

SCHEDULE = "* * * * * */10"  # croniter's sixth field: seconds
SLOTS = 4  # the third is the killed run's
GRACE = 5


def start(env: dict[str, str], *jobs: str) -> subprocess.Popen:
    return spawn([str(ROOT / "manage.py"), "run_scheduler", *(jobs or ["slow_write"])], env=env)


def parent_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))


@pytest.mark.slow
def test_three_schedulers_one_killed_run_every_slot_exactly_once(db_url):
    env = project_env(
        DATABASE_URL=db_url,
        SLOW_WRITE_SCHEDULE=SCHEDULE,
        SLOW_WRITE_TTL="3",
        SLOW_WRITE_SECONDS="2",
        SLOW_WRITE_RETRY="1",
        LOCKS_SCHEDULER_GRACE=str(GRACE),
    )
    schedulers = [start(env) for _ in range(3)]
    try:
        first = Schedule(SCHEDULE).next_slot(database_now())
        # Kill whichever scheduler is in the middle of the third slot's run.
        victim_slot = first + timedelta(seconds=20)
        # Its run's row, not only its lease: killed between the two, it would leave no run to close.
        running = JobRun.objects.filter(job_name="slow_write", tick=victim_slot, status="running")
        wait_for(running.exists, timeout=60, what="a scheduler to start the third slot's run")
        holder = running.get().holder
        child = int(holder.split(":")[1])  # the run's own process; its parent is the scheduler
        victim = next(proc for proc in schedulers if proc.pid == parent_of(child))
        victim.send_signal(signal.SIGKILL)  # as a container stops: the scheduler and its run
        os.kill(child, signal.SIGKILL)
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
    assert all(Schedule(SCHEDULE).slot_at_or_before(tick) == tick for tick in succeeded)
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
def test_an_unreachable_database_is_asked_again_and_the_loop_goes_on(tmp_path):
    """One WARNING per ask, asked again 1 s and then 2 s later within its 4-second slot (then
    the next slot), no traceback, and SIGTERM stops it: exit 0. Watched until three slots were
    asked for (not for a fixed time: a loaded machine starts the process later)."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    env = project_env(
        DATABASE_URL=f"postgres://nobody@127.0.0.1:{port}/contests", SLOW_WRITE_SCHEDULE="* * * * * */4"
    )
    log = tmp_path / "scheduler.log"
    with log.open("w") as err:
        command = [sys.executable, str(ROOT / "manage.py"), "run_scheduler", "slow_write"]
        scheduler = subprocess.Popen(command, cwd=ROOT, env=env, stdout=subprocess.DEVNULL, stderr=err)

    def warnings() -> list[
        str
    ]:  # the asks' (not the scheduler's own: "SIGTERM received", if it came mid-ask)
        return [line for line in log.read_text().splitlines() if " WARNING locks.api " in line]

    def ticks() -> Counter:
        return Counter(line.split(" tick=", 1)[1].split()[0] for line in warnings())

    try:
        wait_for(lambda: len(ticks()) >= 3 and max(ticks().values()) >= 2, timeout=90, what="three slots")
    finally:
        scheduler.send_signal(signal.SIGTERM)
        scheduler.wait(timeout=30)

    assert scheduler.returncode == 0, log.read_text()
    assert "Traceback" not in log.read_text()
    assert set(ticks().values()) <= {1, 2, 3}, warnings()  # on and on, a slot at a time
    assert all("outcome=skipped reason=database unreachable" in line for line in warnings())


def succeeded_ticks(job: str) -> list:
    return list(
        JobRun.objects.filter(job_name=job, status="succeeded")
        .order_by("tick")
        .values_list("tick", flat=True)
    )


@pytest.mark.slow
def test_a_long_run_of_one_job_never_makes_another_jobs_slot_pass_unasked(db_url):
    """Reproduction 7: one scheduler ran linger (60 s) and slept to its next slot after it, so
    every slot of write_slot (each 2 s) in between passed unasked. Now write_slot's slots run
    while linger runs."""
    env = project_env(DATABASE_URL=db_url, WRITE_SLOT_SCHEDULE="* * * * * */2", LOCKS_SCHEDULER_GRACE="1")
    scheduler = start(env, "linger", "write_slot")  # linger first: on start it catches up its slot
    try:
        wait_for(
            lambda: JobRun.objects.filter(job_name="linger", status="running").exists(),
            timeout=30,
            what="linger to start",
        )
        wait_for(
            lambda: len(succeeded_ticks("write_slot")) >= 3, timeout=30, what="three slots of write_slot"
        )
        still = JobRun.objects.get(job_name="linger").status
        scheduler.send_signal(signal.SIGTERM)
        _out, err = scheduler.communicate(timeout=30)
    finally:
        if scheduler.poll() is None:
            scheduler.kill()
            scheduler.communicate()

    assert still == "running"  # all that while
    ticks = succeeded_ticks("write_slot")
    assert all(later - earlier == timedelta(seconds=2) for earlier, later in pairwise(ticks[:3])), ticks
    assert scheduler.returncode == 0 and "Traceback" not in err, err


@pytest.mark.slow
def test_one_jobs_locked_lock_row_never_stops_another_job(db_url, locked_row):
    """A write in progress holds slow_write's lock row (here: a transaction of this test that
    stays open, as a frozen holder's would): every ask of slow_write skips at once and says so,
    and write_slot's slots run meanwhile. Before, the ask waited on the row with no bound."""
    SyncLock.objects.create(job_name="slow_write")  # free: a contender's compare-and-set matches it
    locked_row("slow_write")
    env = project_env(
        DATABASE_URL=db_url, SLOW_WRITE_SCHEDULE="* * * * * */2", WRITE_SLOT_SCHEDULE="* * * * * */2"
    )
    scheduler = start(env, "slow_write", "write_slot")
    try:
        wait_for(
            lambda: len(succeeded_ticks("write_slot")) >= 3, timeout=40, what="three slots of write_slot"
        )
        scheduler.send_signal(signal.SIGTERM)
        _out, err = scheduler.communicate(timeout=30)
    finally:
        if scheduler.poll() is None:
            scheduler.kill()
            scheduler.communicate()

    assert scheduler.returncode == 0 and "Traceback" not in err, err
    # The runs' result lines (the scheduler's own "asking again" lines name no reason).
    skips = [
        line
        for line in err.splitlines()
        if " locks.api job=slow_write " in line and "outcome=skipped" in line
    ]
    assert skips and all("the lock row is locked by a write in progress" in line for line in skips), skips
    assert not JobRun.objects.filter(job_name="slow_write").exists()


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
    # Before its body began (the JobRun is written first), or in it.
    assert run.status == "failed" and run.error.startswith("interrupted") and "SystemExit: 0" in run.error
    assert SyncLock.objects.get(job_name="linger").locked_until is None  # released, not left to expire
    assert "Traceback" not in err
