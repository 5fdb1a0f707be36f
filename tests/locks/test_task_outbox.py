"""A task job on a backend outside the database (tests.jobsapp.backends.OutsideBackend, its sends in a
SQLite file of its own): the slot's outbox row is written in the fenced transaction and sent once it
commits; locks.once lets a task delivered again do nothing (locks.tasks, docs/jobs.md)."""

from __future__ import annotations

import importlib.util
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.db.models.functions import Now

from locks import Outcome, once, run_job
from locks.models import JobRun, SyncLock, TaskOutbox
from tests.conftest import manage, project_env
from tests.jobsapp.models import SlotWrite
from tests.locks.conftest import register

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("django_tasks_db") is None,
    reason="needs django-tasks-db (and on Django 5.2 the django-tasks backport): the extra [tasks]",
)

YEARLY = "0 0 1 1 *"  # one slot for the whole test: the latest at or before now
SLOT = datetime(datetime.now(UTC).year, 1, 1, tzinfo=UTC)
JOB = {"schedule": YEARLY, "task": "tests.jobsapp.tasks.record_once", "ttl": 2, "retry": {"delays": [1, 1]}}


@pytest.fixture
def outside(settings, db, tmp_path, monkeypatch):
    """The outside backend for this process; the job "outbox_task" registered."""
    from tests.jobsapp.backends import sent_outside

    monkeypatch.setenv("OUTSIDE_TASKS", str(tmp_path / "outside.sqlite3"))
    settings.TASKS = {"default": {"BACKEND": "tests.jobsapp.backends.OutsideBackend"}}
    register(settings, outbox_task=JOB)
    return sent_outside


def writes() -> list:
    return list(SlotWrite.objects.filter(job="outbox_task").values_list("tick", flat=True))


def test_the_outbox_row_is_sent_once_and_a_task_delivered_again_does_nothing(outside, monkeypatch):
    monkeypatch.setenv("TASK_REDELIVER", "1")
    done = run_job(name="outbox_task")
    assert done.outcome == Outcome.SUCCEEDED, done.describe()
    row = TaskOutbox.objects.get()
    assert (row.tick, row.token, row.task_id == done.stats["task"]) == (SLOT, done.token, True)
    assert row.claimed_at is not None and row.done_at is not None
    assert outside() == [{"slot": SLOT.isoformat(), "token": done.token}]
    assert writes() == [SLOT]  # delivered twice, its body ran once


def test_a_task_that_raised_fails_the_slot_and_the_next_attempt_sends_the_row_again(
    outside, tmp_path, monkeypatch
):
    monkeypatch.setenv("TASK_FAIL_FILE", str(tmp_path / "fail"))
    (tmp_path / "fail").touch()
    failed = run_job(name="outbox_task")
    assert failed.outcome == Outcome.FAILED_EXPECTED  # a task that raised: recorded failed
    assert failed.failure.error.endswith(f"failed: ValueError: refused slot {SLOT.isoformat()}")
    assert TaskOutbox.objects.get().done_at is None  # the body's transaction rolled back with its mark
    time.sleep(1.1)  # the failed attempt's retry delay
    retried = run_job(name="outbox_task")
    assert (retried.outcome, retried.grant.attempt) == (Outcome.SUCCEEDED, 2), retried.describe()
    assert [sent["token"] for sent in outside()] == [failed.token, retried.token]
    assert TaskOutbox.objects.get().token == retried.token
    assert writes() == [SLOT]


def test_a_row_a_crash_left_unsent_is_sent_by_the_jobs_next_run_and_one_sent_long_ago_is_deleted(outside):
    earlier, long_ago = (datetime(SLOT.year - years, 1, 1, tzinfo=UTC) for years in (1, 2))
    TaskOutbox.objects.create(job_name="outbox_task", tick=earlier, token=7)
    TaskOutbox.objects.create(
        job_name="outbox_task", tick=long_ago, token=3, claimed_at=long_ago, task_id="x"
    )
    done = run_job(name="outbox_task")
    assert done.outcome == Outcome.SUCCEEDED, done.describe()
    assert [sent["slot"] for sent in outside()] == [earlier.isoformat(), SLOT.isoformat()]
    assert sorted(writes()) == [earlier, SLOT]
    assert sorted(TaskOutbox.objects.values_list("tick", flat=True)) == [
        earlier,
        SLOT,
    ]  # past retention: gone


def test_a_forced_run_whose_row_another_dispatcher_sends_does_not_take_an_earlier_forced_rows_done_mark(
    outside,
):
    """A forced run's row is its own (by token): another dispatcher (the scheduler's sweep) claims it
    between its commit and the run's own send, so the run cannot follow it and says so; an earlier
    forced run's row, done, is not this one's (it answered "task_done_earlier", a success, before)."""
    earlier = datetime.now(UTC) - timedelta(minutes=5)
    TaskOutbox.objects.create(
        job_name="outbox_task", tick=None, token=99, task_id="x", claimed_at=earlier, done_at=earlier
    )
    claimed = []

    def another_dispatcher(execute, sql, params, many, context):
        if not claimed and sql.startswith("UPDATE") and "taskoutbox" in sql and "claimed_at" in sql:
            claimed.append(0)  # before its own UPDATE comes through here
            claimed[0] = TaskOutbox.objects.filter(task_id="", done_at=None).update(claimed_at=Now())
        return execute(sql, params, many, context)

    with connection.execute_wrapper(another_dispatcher):
        forced = run_job(name="outbox_task", force=True)

    assert claimed == [1] and outside() == []
    assert forced.outcome == Outcome.UNKNOWN, forced.describe()  # its task's fate is not known here
    assert forced.failure.error.endswith("slot forced: its outbox row is being sent by another run")


def test_once_refuses_a_task_with_no_outbox_row(db):
    guarded = once("outbox_task")(lambda **kwargs: kwargs)
    with pytest.raises(LookupError, match="no outbox row of 'outbox_task' for slot 2020-01-01T00:00:00"):
        guarded(slot="2020-01-01T00:00:00+00:00", token=1)


@pytest.mark.parametrize("death", ["before", "after"])
def test_a_process_killed_around_the_send_leaves_the_slot_with_its_row_and_its_task_done_once(
    db_url, tmp_path, monkeypatch, death
):
    from tests.jobsapp.backends import sent_outside

    monkeypatch.setenv("OUTSIDE_TASKS", str(tmp_path / "outside.sqlite3"))
    env = project_env(
        DATABASE_URL=db_url,
        OUTSIDE_TASKS=str(tmp_path / "outside.sqlite3"),
        SLOT_TASK_SCHEDULE=YEARLY,
        SLOT_TASK_TTL="1",
        HOSTPROJECT_JOBS="outbox_task",
    )
    dead = manage("run_job", "outbox_task", env={**env, "TASK_DIE": death})
    assert dead.returncode == 9, dead.stderr
    lock = SyncLock.objects.get(job_name="outbox_task")
    assert (lock.tick, lock.tick_done, lock.tick_attempts) == (SLOT, False, 1)  # claimed, not done
    row = TaskOutbox.objects.get()  # committed with the claim: no slot without its task
    assert (row.tick, row.task_id, row.claimed_at is not None) == (SLOT, "", True)
    assert (len(sent_outside()), row.done_at is not None) == ((1, True) if death == "after" else (0, False))
    time.sleep(1.2)  # the dead holder's lease, and its claim on the row, expire
    done = manage("run_job", "outbox_task", env=env)
    assert done.returncode == 0, done.stderr
    assert "outcome=succeeded" in done.stderr and "attempt=2/3" in done.stderr
    assert len(sent_outside()) == 1  # "after": its body committed, so the row is done, not sent again
    assert writes() == [SLOT]
    statuses = list(JobRun.objects.order_by("token").values_list("status", flat=True))
    assert statuses == [Outcome.ABANDONED, Outcome.SUCCEEDED]


def test_the_scheduler_sends_a_row_a_crash_left_once_no_run_holds_the_jobs_lease(outside):
    from locks.lease import acquire, release
    from locks.registry import get_job
    from locks.tasks import sweep

    TaskOutbox.objects.create(job_name="outbox_task", tick=SLOT, token=1)
    lease = acquire(job="outbox_task", tick=None, ttl=timedelta(seconds=60))
    sweep([get_job("outbox_task")])
    assert outside() == []  # a run holds the lease: it sends its job's rows itself
    release(lease=lease, status=Outcome.SUCCEEDED)
    sweep([get_job("outbox_task")])
    assert outside() == [{"slot": SLOT.isoformat(), "token": 1}]
    assert writes() == [SLOT] and TaskOutbox.objects.get().task_id != ""


@pytest.mark.django_db(transaction=True)
def test_a_broker_that_stalls_the_sweep_costs_no_other_jobs_run_its_lease(
    outside, settings, monkeypatch, db_url
):
    """A task job's row a crash left unsent: ``run_scheduler`` sends it from its loop (``sweep``), through
    the task backend (Redis, RQ: outside the database). A broker that does not answer for a while (a
    failover, a connect timeout) holds the loop there; the loop is also what renews the leases of its
    workers' runs, one statement a beat (rule 5). So another job's run, which renews nothing itself while
    its scheduler lives, lost its lease once its TTL passed, and ended lost_lock though nothing was wrong
    with it or the database. The loop now sweeps only while no run of its own is going on."""
    import threading

    from locks.registry import jobs
    from locks.scheduler import Scheduler
    from tests.jobsapp.backends import OutsideBackend

    register(settings, slow_write={**settings.LOCKS_JOBS["slow_write"], "schedule": YEARLY, "ttl": 3})
    monkeypatch.setenv("SLOW_WRITE_SECONDS", "6")  # two beats of its 3 s lease, and more
    SyncLock.objects.create(job_name="outbox_task", tick=SLOT, tick_done=True)  # its slot ran: a skip
    earlier = datetime(SLOT.year - 1, 1, 1, tzinfo=UTC)
    TaskOutbox.objects.create(job_name="outbox_task", tick=earlier, token=1)  # left unsent by a crash
    send = OutsideBackend.enqueue

    def stalls(self, task, args, kwargs):
        time.sleep(8)  # the broker does not answer for a while
        return send(self, task, args, kwargs)

    monkeypatch.setattr(OutsideBackend, "enqueue", stalls)
    registered = jobs()
    scheduler = Scheduler([registered["slow_write"], registered["outbox_task"]], workers=2, claim=True)
    timer = threading.Timer(15, lambda: (scheduler.stop.set(), scheduler.wake()))
    timer.start()
    try:
        scheduler.run_forever()
    finally:
        timer.cancel()
        scheduler.executor.retire()

    assert outside() == [{"slot": earlier.isoformat(), "token": 1}]  # the sweep sent the row
    run = JobRun.objects.get(job_name="slow_write")
    assert (run.status, run.error) == (Outcome.SUCCEEDED, "")
