"""A task job (locks.tasks) under real processes: ``run_scheduler`` replicas (3 on PostgreSQL, 2 on
SQLite) and a real ``db_worker`` (django-tasks-db). Every 4 seconds a slot; one replica is killed
(with the run that follows its slot's task) and so is the worker, then a new one starts: each slot's
task is enqueued once and run once, and each slot succeeds once (7 slots: the replica killed in the
third, the worker after the fourth). Skipped without the tasks packages."""

from __future__ import annotations

import importlib.util
import os
import signal
import subprocess
from collections import Counter
from datetime import timedelta

import pytest
from django.db import connection

from locks.models import JobRun, database_now
from locks.schedule import Schedule
from tests.conftest import ROOT, project_env, spawn
from tests.jobsapp.models import SlotWrite
from tests.locks.conftest import wait_for
from tests.locks.test_scheduler_processes import parent_of

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("django_tasks_db") is None,
    reason="needs django-tasks-db (and on Django 5.2 the django-tasks backport): the extra [tasks]",
)

SCHEDULE = "* * * * * */4"  # croniter's sixth field: seconds
SLOTS = 7


def worker(env: dict[str, str]) -> subprocess.Popen:
    return spawn([str(ROOT / "manage.py"), "db_worker", "--interval", "0.1", "--no-reload"], env=env)


def succeeded(slot) -> bool:
    return JobRun.objects.filter(job_name="slot_task", tick=slot, status="succeeded").exists()


@pytest.mark.slow
def test_replicas_and_a_worker_each_killed_once_enqueue_and_run_each_slots_task_once(db_url):
    from django_tasks_db.models import DBTaskResult

    replicas = 3 if connection.vendor == "postgresql" else 2
    env = project_env(
        DATABASE_URL=db_url,
        HOSTPROJECT_JOBS="slot_task",
        SLOT_TASK_SCHEDULE=SCHEDULE,
        SLOT_TASK_TTL="2",
        SLOT_TASK_WAIT="20",
        SLOT_TASK_RETRY="1,1",
        TASK_SECONDS="1",  # so that the replica killed is following its slot's task
        LOCKS_SCHEDULER_GRACE="3",
    )
    schedulers = [
        spawn([str(ROOT / "manage.py"), "run_scheduler", "slot_task"], env=env) for _ in range(replicas)
    ]
    workers = [worker(env)]
    try:
        first = Schedule(SCHEDULE).next_slot(database_now()) + timedelta(seconds=4)  # all started by then
        slots = [first + timedelta(seconds=4 * index) for index in range(SLOTS)]
        # A replica killed while its run follows the third slot's task.
        running = JobRun.objects.filter(
            job_name="slot_task", tick=slots[2], status="running", stats__has_key="task"
        )  # its task enqueued
        wait_for(running.exists, timeout=40, what="a replica to follow the third slot's task")
        child = int(running.get().holder.split(":")[1])
        victim = next(proc for proc in schedulers if proc.pid == parent_of(child))
        victim.send_signal(signal.SIGKILL)
        os.kill(child, signal.SIGKILL)
        # The worker killed once the fourth slot's task is done; a new one started once the fifth slot's
        # task is enqueued with no worker to run it (not a fixed 4 s later: under CI's load its run then
        # held the lease through the sixth slot's chance, and that slot was missed).
        wait_for(lambda: succeeded(slots[3]), timeout=30, what="the fourth slot to succeed")
        workers[0].send_signal(signal.SIGKILL)
        fifth = JobRun.objects.filter(job_name="slot_task", tick=slots[4], stats__has_key="task")
        wait_for(fifth.exists, timeout=30, what="the fifth slot's task enqueued")
        workers.append(worker(env))
        wait_for(lambda: succeeded(slots[-1]), timeout=40, what="the last slot to succeed")
    finally:
        for proc in schedulers + workers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in schedulers + workers:
            try:
                proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()

    enqueued = Counter(row.args_kwargs["kwargs"]["slot"] for row in DBTaskResult.objects.all())
    ran = Counter(row.tick for row in SlotWrite.objects.filter(job="slot_task"))
    won = Counter(
        JobRun.objects.filter(job_name="slot_task", status="succeeded").values_list("tick", flat=True)
    )
    assert [enqueued[slot.isoformat()] for slot in slots] == [1] * SLOTS, enqueued
    assert [ran[slot] for slot in slots] == [1] * SLOTS, ran
    assert [won[slot] for slot in slots] == [1] * SLOTS, won
    assert max(enqueued.values()) == max(ran.values()) == max(won.values()) == 1  # none twice, ever
    assert set(DBTaskResult.objects.values_list("status", flat=True)) == {"SUCCESSFUL"}
    killed = JobRun.objects.get(job_name="slot_task", tick=slots[2], status="abandoned")
    assert killed.stats["task"]  # its task was enqueued; the next attempt followed it


@pytest.mark.slow
def test_replicas_on_a_backend_outside_the_database_run_each_slots_task_body_once(
    db_url, tmp_path, monkeypatch
):
    """The outbox (OutsideBackend runs each task in the process that sends it): the replica whose run
    is inside the third slot's task body (it hangs there, its pid in a file) is killed; a later
    attempt or a replica's sweep sends the row again. Five slots: watched until that body ran and
    the last slot's did."""
    from locks.models import TaskOutbox
    from tests.jobsapp.backends import sent_outside

    replicas = 3 if connection.vendor == "postgresql" else 2
    first = Schedule(SCHEDULE).next_slot(database_now()) + timedelta(seconds=4)  # all started by then
    slots = [first + timedelta(seconds=4 * index) for index in range(5)]
    hang = tmp_path / "hang"
    env = project_env(
        DATABASE_URL=db_url,
        OUTSIDE_TASKS=str(tmp_path / "outside.sqlite3"),
        HOSTPROJECT_JOBS="outbox_task",
        SLOT_TASK_SCHEDULE=SCHEDULE,
        SLOT_TASK_TTL="2",
        SLOT_TASK_RETRY="1,1,1",
        TASK_HANG_SLOT=slots[2].isoformat(),
        TASK_HANG_FILE=str(hang),
        LOCKS_SCHEDULER_GRACE="3",
    )
    monkeypatch.setenv("OUTSIDE_TASKS", env["OUTSIDE_TASKS"])  # sent_outside() reads it here
    schedulers = [
        spawn([str(ROOT / "manage.py"), "run_scheduler", "outbox_task"], env=env) for _ in range(replicas)
    ]
    try:
        wait_for(lambda: hang.exists() and hang.read_text().strip(), timeout=40, what="the third slot's body")
        child = int(hang.read_text())
        victim = next(proc for proc in schedulers if proc.pid == parent_of(child))
        victim.send_signal(signal.SIGKILL)
        os.kill(child, signal.SIGKILL)
        bodies = SlotWrite.objects.filter(job="outbox_task")
        wait_for(
            lambda: all(bodies.filter(tick=slot).exists() for slot in (slots[2], slots[-1])),
            timeout=60,
            what="the third slot's task body (its row sent again) and the last slot's",
        )
    finally:
        for proc in schedulers:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in schedulers:
            try:
                proc.communicate(timeout=20)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.communicate()

    sent = Counter(row["slot"] for row in sent_outside())
    ran = Counter(row.tick for row in SlotWrite.objects.filter(job="outbox_task"))
    assert [ran[slot] for slot in slots] == [1] * len(slots), ran
    assert all(sent[slot.isoformat()] >= 1 for slot in slots), sent
    assert sent[slots[2].isoformat()] == 2  # killed inside its body: its row sent again, its body once
    assert max(ran.values()) == 1  # no body twice, ever
    rows = TaskOutbox.objects.filter(job_name="outbox_task", tick__in=slots)
    assert rows.count() == len(slots) and not rows.filter(done_at=None).exists()
