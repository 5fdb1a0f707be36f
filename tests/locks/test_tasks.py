"""A job whose work is a django.tasks ``Task`` (locks.tasks): enqueued once a slot by its winner, in
the fenced transaction, and followed by the run to its end; a real ``db_worker`` (django-tasks-db)
runs it. Skipped without the tasks packages (the extra [tasks])."""

from __future__ import annotations

import importlib.util
import signal
import subprocess
import time
from datetime import UTC, datetime

import pytest
from django.core.checks import run_checks

from locks import Outcome, run_job
from locks.models import JobRun, SyncLock
from tests.conftest import ROOT, manage, project_env, spawn
from tests.jobsapp.models import SlotWrite
from tests.locks.conftest import register

pytestmark = pytest.mark.skipif(
    importlib.util.find_spec("django_tasks_db") is None,
    reason="needs django-tasks-db (and on Django 5.2 the django-tasks backport): the extra [tasks]",
)

YEARLY = "0 0 1 1 *"  # one slot for the whole test: the latest at or before now
SLOT = datetime(datetime.now(UTC).year, 1, 1, tzinfo=UTC)
TASK = {
    **{"schedule": YEARLY, "task": "tests.jobsapp.tasks.record_slot", "ttl": 2, "max_run_time": 20},
    "retry": {"delays": [1, 1]},
}


def start_worker(env: dict[str, str]) -> subprocess.Popen:
    """A real ``db_worker``, one process (no autoreload: SIGKILL then stops it all)."""
    command = ["db_worker", "--interval", "0.1", "--no-startup-delay", "--no-reload"]
    return spawn([str(ROOT / "manage.py"), *command], env=env)


def tasks() -> list:
    from django_tasks_db.models import DBTaskResult

    return list(DBTaskResult.objects.order_by("enqueued_at"))


@pytest.fixture
def worker(db_url, tmp_path):
    """A real ``db_worker`` on the test database; TASK_FAIL_FILE: its first task raises."""
    env = project_env(DATABASE_URL=db_url, TASK_FAIL_FILE=str(tmp_path / "fail"))
    proc = start_worker(env)
    yield tmp_path / "fail"
    proc.send_signal(signal.SIGKILL)
    proc.communicate()


def test_the_checks_refuse_a_job_naming_a_callable_and_a_task(settings):
    register(settings, both={**TASK, "callable": "tests.jobsapp.jobs.record"})
    assert [(e.id, e.msg) for e in run_checks(tags=["locks"])] == [
        ("locks.E035", "LOCKS_JOBS['both'] names both a callable and a task: a job runs one of them.")
    ]


def test_the_checks_refuse_a_task_that_is_not_a_django_task_and_accept_one_that_is(settings):
    register(settings, plain={**TASK, "task": "tests.jobsapp.jobs.record"}, task_job=TASK)
    assert [(e.id, e.msg) for e in run_checks(tags=["locks"])] == [
        (
            "locks.E036",
            "LOCKS_JOBS['plain']: task 'tests.jobsapp.jobs.record' is not a django.tasks Task "
            "(decorate it with @task).",
        )
    ]


def test_the_winner_enqueues_the_task_once_with_its_slot_and_token_and_the_run_follows_it(settings, worker):
    register(settings, slot_task=TASK)
    result = run_job(name="slot_task")
    assert result.outcome == Outcome.SUCCEEDED, result.describe()
    (task,) = tasks()
    assert task.args_kwargs["kwargs"] == {"slot": SLOT.isoformat(), "token": result.token}
    assert JobRun.objects.get(token=result.token).stats["task"] == str(task.id)
    assert SlotWrite.objects.get().tick == SLOT
    again = run_job(name="slot_task")
    assert again.skip.reason == "tick_claimed"
    assert len(tasks()) == 1


def test_a_task_that_raised_fails_the_slot_and_a_later_attempt_runs_it_again(settings, worker):
    register(settings, slot_task=TASK)
    worker.touch()  # the task's first run raises
    failed = run_job(name="slot_task")
    first = tasks()[0]
    assert failed.outcome == Outcome.FAILED_EXPECTED
    assert failed.failure.error == f"task {first.id} failed: ValueError: refused slot {SLOT.isoformat()}"
    run = JobRun.objects.get(token=failed.token)
    assert (run.status, run.error, run.stats) == (
        Outcome.FAILED,
        failed.failure.error,
        {"task": str(first.id)},
    )
    assert not SyncLock.objects.get(job_name="slot_task").tick_done
    time.sleep(1.1)  # the retry delay
    retried = run_job(name="slot_task")
    assert (retried.outcome, retried.grant.attempt) == (Outcome.SUCCEEDED, 2), retried.describe()
    assert [t.status for t in tasks()] == ["FAILED", "SUCCESSFUL"]
    assert SlotWrite.objects.get().token == retried.token


def test_a_task_that_never_finishes_is_unknown_and_the_next_attempt_follows_it_instead_of_enqueuing(
    settings, db_url, tmp_path
):
    register(settings, slot_task={**TASK, "max_run_time": 1})  # no worker yet
    unknown = run_job(name="slot_task")
    assert unknown.outcome == Outcome.UNKNOWN
    assert "is READY after 0:00:01: a later attempt follows it" in unknown.failure.error
    env = project_env(DATABASE_URL=db_url)
    proc = start_worker(env)
    try:
        register(settings, slot_task={**TASK, "max_run_time": 30})
        time.sleep(1.1)
        followed = run_job(name="slot_task")
    finally:
        proc.kill()
        proc.communicate()
    assert followed.outcome == Outcome.SUCCEEDED, followed.describe()
    assert [t.status for t in tasks()] == ["SUCCESSFUL"]
    assert JobRun.objects.get(token=unknown.token).stats == {"task": followed.stats["task"]}


@pytest.mark.parametrize("death", ["before", "after"])
def test_a_process_killed_between_claim_and_enqueue_leaves_no_slot_without_its_task_nor_a_task_without_its_slot(
    db_url, death
):
    env = project_env(
        DATABASE_URL=db_url,
        SLOT_TASK_SCHEDULE=YEARLY,
        SLOT_TASK_TTL="1",
        SLOT_TASK_WAIT="30",
        HOSTPROJECT_JOBS="slot_task",
    )
    dead = manage("run_job", "slot_task", env={**env, "TASK_DIE": death})
    assert dead.returncode == 9, dead.stderr
    lock = SyncLock.objects.get(job_name="slot_task")
    assert (lock.tick, lock.tick_done, lock.tick_attempts) == (SLOT, False, 1)  # claimed, not done
    assert tasks() == []  # and no task: the enqueue died with its transaction
    time.sleep(1.2)  # the dead holder's lease expires
    worker = start_worker(env)
    try:
        done = manage("run_job", "slot_task", env=env)
    finally:
        worker.kill()
        worker.communicate()
    assert done.returncode == 0, done.stderr
    assert "outcome=succeeded" in done.stderr and "attempt=2/3" in done.stderr
    (task,) = tasks()
    assert task.status == "SUCCESSFUL"
    assert [row.tick for row in SlotWrite.objects.all()] == [SLOT]
    statuses = list(JobRun.objects.order_by("token").values_list("status", flat=True))
    assert statuses == [Outcome.ABANDONED, Outcome.SUCCEEDED]


def test_on_the_immediate_backend_the_task_runs_in_the_fenced_transaction_and_a_failed_one_runs_again(
    settings, db, tmp_path, monkeypatch
):
    settings.TASKS = {"default": {"BACKEND": f"{tasks_module()}.backends.immediate.ImmediateBackend"}}
    register(settings, slot_task={**TASK, "retry": {"delays": [1]}})
    fail = tmp_path / "fail"
    monkeypatch.setenv("TASK_FAIL_FILE", str(fail))
    fail.touch()
    failed = run_job(name="slot_task")
    assert failed.outcome == Outcome.FAILED_EXPECTED
    assert failed.failure.error.endswith(f"failed: ValueError: refused slot {SLOT.isoformat()}")
    time.sleep(1.1)
    retried = run_job(name="slot_task")
    assert (retried.outcome, retried.grant.attempt) == (Outcome.SUCCEEDED, 2), retried.describe()
    assert SlotWrite.objects.get().token == retried.token


def tasks_module() -> str:
    return "django.tasks" if importlib.util.find_spec("django.tasks") else "django_tasks"


def test_a_run_killed_following_its_task_takes_the_tasks_outcome_at_the_next_slots_run(settings, db_url):
    """The slot follows its task (issue 39, item 3) even when its chance ends first: yesterday's run
    is killed while it follows its task (no worker yet; no attempt of that slot comes again), a real
    ``db_worker`` then runs the task, and today's run settles yesterday's from its task: the ledger
    says what the task did, not ``abandoned``."""
    from datetime import timedelta

    from locks.registry import get_job
    from locks.status import job_ledgers

    daily = "0 0 * * *"
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    env = project_env(
        DATABASE_URL=db_url,
        SLOT_TASK_SCHEDULE=daily,
        SLOT_TASK_TTL="1",
        SLOT_TASK_WAIT="1",
        HOSTPROJECT_JOBS="slot_task",
    )
    tick = (today - timedelta(days=1)).isoformat()
    follower = spawn(
        [str(ROOT / "manage.py"), "run_job", "slot_task", "--tick", tick], env={**env, "SLOT_TASK_WAIT": "60"}
    )
    try:
        deadline = time.monotonic() + 60
        while not tasks() and time.monotonic() < deadline and follower.poll() is None:
            time.sleep(0.1)  # until its task is committed (the follower then polls its result)
        (yesterdays,) = tasks()
    finally:
        follower.send_signal(signal.SIGKILL)
        follower.communicate()
    ran = manage("db_worker", "--batch", "--no-startup-delay", "--no-reload", env=env)
    assert ran.returncode == 0, ran.stderr
    time.sleep(1.2)  # the killed run's lease expires
    todays = manage("run_job", "slot_task", env=env)  # no worker now: its own task stays READY
    assert "outcome=unknown" in todays.stderr, todays.stderr
    killed = JobRun.objects.get(stats__task=str(yesterdays.id))
    assert (killed.status, killed.error) == (
        Outcome.SUCCEEDED,
        f"its task {yesterdays.id} finished after the run stopped following it",
    )
    register(settings, slot_task={**TASK, "schedule": daily})  # the subprocesses' job, here too
    ledger = job_ledgers(jobs=[get_job("slot_task")], slots=2)["slot_task"]
    assert [(slot.tick, slot.outcome) for slot in ledger.slots] == [
        (today, Outcome.UNKNOWN),
        (today - timedelta(days=1), Outcome.SUCCEEDED),
    ]


def test_a_slot_whose_last_attempt_stopped_following_its_task_takes_the_tasks_outcome(settings, db_url):
    """The unknown twin of ``test_a_run_killed_following_its_task_takes_the_tasks_outcome_...``: yesterday's
    slot (one attempt) follows its task for its max_run_time, no worker runs it, and the run ends
    ``unknown`` ("a later attempt follows it": none comes, its chance is over). A worker then runs the task,
    which succeeds; today's run settles the earlier runs that stopped following their task
    (``_settle_outlived``: abandoned or unknown). Its lease first resolves the unknown runs of earlier
    tokens from the lock row's committed token (rule 10), which a task's enqueue never sets: yesterday's
    run was recorded failed ("the lock row shows its fenced write did not commit") and the ledger said
    yesterday failed, its task done. Such a run is now left to its task's outcome."""
    from datetime import timedelta

    from locks.registry import get_job
    from locks.status import job_ledgers

    daily = {**TASK, "schedule": "0 0 * * *", "max_run_time": 1, "retry": {"delays": []}}
    register(settings, slot_task=daily)  # no worker yet
    today = datetime.now(UTC).replace(hour=0, minute=0, second=0, microsecond=0)
    yesterday = today - timedelta(days=1)
    unknown = run_job(name="slot_task", tick=yesterday)
    assert unknown.outcome == Outcome.UNKNOWN, unknown.describe()
    ran = manage(
        "db_worker", "--batch", "--no-startup-delay", "--no-reload", env=project_env(DATABASE_URL=db_url)
    )
    assert ran.returncode == 0, ran.stderr
    assert [t.status for t in tasks()] == ["SUCCESSFUL"]

    run_job(name="slot_task")  # today's run (no worker now: its own task stays READY)

    run = JobRun.objects.get(token=unknown.token)
    after = f"its task {run.stats['task']} finished after the run stopped following it"
    assert (run.status, run.error) == (Outcome.SUCCEEDED, after)
    ledger = job_ledgers(jobs=[get_job("slot_task")], slots=2)["slot_task"]
    assert [(slot.tick, slot.outcome) for slot in ledger.slots][1] == (yesterday, Outcome.SUCCEEDED)
