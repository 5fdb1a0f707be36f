"""Jobs whose work is a django.tasks ``Task`` (``"task"`` in a ``LOCKS_JOBS`` entry): the slot's
winner enqueues it in a fenced transaction, once per slot, and its run follows the task to its end
(docs/jobs.md, "Periodic tasks")."""

from __future__ import annotations

import functools
import time
from collections.abc import Callable
from datetime import timedelta

from django.utils.module_loading import import_string

from locks.lease import CommitUnknown, Lease, fenced, iso
from locks.models import JobRun

try:  # Django 6.0 ships the framework; on 5.2 the django-tasks backport does (the extra [tasks])
    from django.tasks import Task, TaskResultStatus
    from django.tasks.exceptions import TaskResultDoesNotExist
except ImportError:
    try:
        from django_tasks import TaskResultStatus
        from django_tasks.base import Task
        from django_tasks.exceptions import TaskResultDoesNotExist
    except ImportError:
        Task = TaskResultStatus = TaskResultDoesNotExist = None

# How long a run follows its task when the job names no max_run_time; then the slot is unknown.
DEFAULT_WAIT = timedelta(hours=1)
POLL_SECONDS = 0.5  # between two reads of the task's result


class TaskFailed(RuntimeError):
    """The slot's task raised: the run failed with its error, and a later attempt enqueues it again."""


class TaskUnfinished(CommitUnknown):
    """The slot's task did not finish in time: the slot is unknown, and a later attempt follows it."""


def is_task(target) -> bool:
    return Task is not None and isinstance(target, Task)


def task_runner(*, task_path: str, wait: timedelta | None) -> Callable[[Lease], dict]:
    """The function a task job's run calls with its lease (``locks.runner.run_job``)."""
    return functools.partial(run_task, task_path=task_path, wait=wait or DEFAULT_WAIT)


def run_task(lease: Lease, *, task_path: str, wait: timedelta) -> dict:
    """The slot's task, enqueued unless an earlier attempt's is still on its way, then followed until
    it finishes: its outcome is the run's."""
    task = import_string(task_path)
    result = _earlier_task(lease, task) or _enqueue(lease, task)
    deadline = time.monotonic() + wait.total_seconds()
    while not result.is_finished:
        if lease.lost or time.monotonic() > deadline:
            raise TaskUnfinished(
                f"task {result.id} of slot {iso(lease.tick)} is {result.status} after {wait}: "
                "a later attempt follows it"
            )
        time.sleep(POLL_SECONDS)
        result.refresh()
    if result.status == TaskResultStatus.FAILED:
        last = result.errors[-1].traceback.strip().splitlines()[-1] if result.errors else "no error recorded"
        raise TaskFailed(f"task {result.id} failed: {last}")
    took = (result.finished_at - result.started_at).total_seconds() if result.started_at else 0
    return {"task": str(result.id), "task_seconds": round(took, 3)}


def _enqueue(lease: Lease, task):
    """The slot's task, enqueued in one transaction with the lease's renewal and the run's record of
    it: on a database backend, no task without its slot's lease, and the next attempt finds it."""
    with fenced(lease, settle=False):
        result = task.enqueue(slot=iso(lease.tick), token=lease.token)
        JobRun.objects.for_job(lease.job).filter(token=lease.token).update(stats={"task": str(result.id)})
    return result


def _earlier_task(lease: Lease, task):
    """The task an earlier attempt at this slot enqueued, unless it failed (or is gone)."""
    if lease.tick is None or not task.get_backend().supports_get_result:  # ImmediateBackend: none to follow
        return None
    earlier = JobRun.objects.for_job(lease.job).filter(tick=lease.tick, token__lt=lease.token)
    stats = earlier.filter(stats__has_key="task").order_by("-token").values_list("stats", flat=True).first()
    if stats is None:
        return None
    try:
        result = task.get_result(stats["task"])
    except TaskResultDoesNotExist:
        return None
    return None if result.status == TaskResultStatus.FAILED else result
