"""Jobs whose work is a django.tasks ``Task``: enqueued once per slot in its winner's fenced transaction,
and followed to its end (docs/jobs.md, "Periodic tasks")."""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from datetime import timedelta

from django.conf import settings
from django.db import router
from django.db.models import Q
from django.db.models.functions import Now
from django.utils.module_loading import import_string

from locks.db import write_transaction
from locks.lease import CommitUnknown, Lease, fenced, iso
from locks.models import JobRun, Outcome, SyncLock, TaskOutbox, now_plus

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

logger = logging.getLogger(__name__)
# How long a run follows its task when the job names no max_run_time; then the slot is unknown.
DEFAULT_WAIT = timedelta(hours=1)
POLL_SECONDS = 0.5  # between two reads of the task's result
# Backends whose enqueue the fenced transaction covers: django-tasks-db's (its row is written in it) and
# ImmediateBackend (the task runs in it). Any other is outside the database: its tasks go through TaskOutbox.
IN_TRANSACTION = {"DatabaseBackend", "ImmediateBackend"}


class TaskFailed(RuntimeError):
    """The slot's task raised: the run failed with its error, and a later attempt enqueues it again."""


class TaskUnfinished(CommitUnknown):
    """The slot's task did not finish in time: the slot is unknown, and a later attempt follows it."""


def is_task(target) -> bool:
    return Task is not None and isinstance(target, Task)


def run_task(lease: Lease, *, task_path: str, wait: timedelta | None) -> dict:
    """A task job's run: the slot's task, enqueued unless an earlier attempt's is still on its way,
    then followed until it finishes (at most ``wait``): its outcome is the run's."""
    task, wait = import_string(task_path), wait or DEFAULT_WAIT
    follows = task.get_backend().supports_get_result  # ImmediateBackend's: no result to follow
    if follows:
        _settle_outlived(lease, task)
    result = (follows and _earlier_task(lease, task)) or _enqueue(lease, task)
    if result is None:
        return {"task_done_earlier": 1}
    if not result.is_finished and not follows:
        return {"task": str(result.id)}  # sent; the backend runs it, locks.once guards its body
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
        raise TaskFailed(_failure(result))
    took = (result.finished_at - result.started_at).total_seconds() if result.started_at else 0
    return {"task": str(result.id), "task_seconds": round(took, 3)}


def _enqueue(lease: Lease, task):
    """The slot's task, enqueued in the fenced transaction, or (a backend outside the database)
    through the slot's outbox row written in it and sent once it commits."""
    inside = any(cls.__name__ in IN_TRANSACTION for cls in type(task.get_backend()).__mro__)
    with fenced(lease, settle=False):
        if inside:  # its enqueue is in the transaction: committed with it
            result = task.enqueue(slot=iso(lease.tick), token=lease.token)
            JobRun.objects.for_job(lease.job).filter(token=lease.token).update(stats={"task": str(result.id)})
            return result
        key = {"tick": lease.tick} if lease.tick is not None else {"token": lease.token}  # forced: its own
        rows = TaskOutbox.objects.filter(job_name=lease.job, **key)
        if not rows.exists():
            TaskOutbox.objects.create(job_name=lease.job, tick=lease.tick, token=lease.token)
        else:  # taken over for this attempt unless it is being sent or done
            free = ~Q(task_id="") | Q(claimed_at=None) | Q(claimed_at__lt=now_plus(-lease.ttl))
            rows.filter(free, done_at=None).update(token=lease.token, claimed_at=None, task_id="")
    sent = dispatch(lease.job, task, stale=lease.ttl)
    if lease.token in sent:
        return sent[lease.token]
    if rows.exclude(done_at=None).exists():
        return None  # its body committed (locks.once) under an earlier attempt
    raise TaskUnfinished(f"slot {iso(lease.tick) or 'forced'}: its outbox row is being sent by another run")


def dispatch(job: str, task, *, stale: timedelta) -> dict:
    """Send ``job``'s unsent outbox rows, oldest first, each claimed first (a claim older than ``stale``
    is taken again), and prune old ones; token -> the TaskResult sent."""
    retained = now_plus(-timedelta(days=settings.LOCKS_RUN_RETENTION_DAYS))
    TaskOutbox.objects.filter(job_name=job, claimed_at__lt=retained).exclude(task_id="").delete()
    sent = {}
    unsent = TaskOutbox.objects.filter(job_name=job, task_id="", done_at=None)
    for row in unsent.order_by("pk"):
        free = Q(claimed_at=None) | Q(claimed_at__lt=now_plus(-stale))
        if not unsent.filter(free, pk=row.pk, token=row.token).update(claimed_at=Now()):
            continue  # another dispatcher has it
        result = sent[row.token] = task.enqueue(slot=iso(row.tick), token=row.token)
        TaskOutbox.objects.filter(pk=row.pk, token=row.token).update(task_id=str(result.id))
        JobRun.objects.for_job(job).filter(token=row.token).update(stats={"task": str(result.id)})
    return sent


def sweep(jobs) -> None:
    """Send the outbox rows a crash left unsent, of each task job whose lease no run holds. Never raises."""
    for job in (job for job in jobs if job.task_path):
        try:
            unsent = TaskOutbox.objects.filter(job_name=job.name, task_id="", done_at=None).exists()
            if unsent and SyncLock.objects.for_job(job.name).free().exists():
                dispatch(job.name, import_string(job.task_path), stale=job.ttl)
        except Exception as exc:  # a database or a broker that cannot be reached: the next wake tries
            logger.warning("job=%s the outbox's unsent rows were not sent: %r", job.name, exc)


def once(job: str) -> Callable:
    """Under ``@task``: the body runs in one transaction with its outbox row's done mark, so a task
    delivered again after its body committed returns None."""

    def decorate(body):
        @functools.wraps(body)
        def guarded(*args, slot: str | None, token: int, **kwargs):
            rows = TaskOutbox.objects.filter(job_name=job, **({"tick": slot} if slot else {"token": token}))
            with write_transaction(using=router.db_for_write(TaskOutbox)):  # MongoDB's too
                if rows.filter(done_at=None).update(done_at=Now()):
                    return body(*args, slot=slot, token=token, **kwargs)
            if not rows.exists():
                raise LookupError(f"locks.once: no outbox row of {job!r} for slot {slot}, token {token}")
            return None

        return guarded

    return decorate


def _earlier_task(lease: Lease, task):
    """The task an earlier attempt at this slot enqueued, unless it failed (or is gone)."""
    if lease.tick is None:
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


def _failure(result) -> str:
    last = result.errors[-1].traceback.strip().splitlines()[-1] if result.errors else "no error recorded"
    return f"task {result.id} failed: {last}"


def _settle_outlived(lease: Lease, task) -> None:
    """Earlier slots' runs that stopped following their task (``abandoned``, ``unknown``) and were
    not attempted again take their task's outcome once it has one."""
    runs = JobRun.objects.for_job(lease.job).filter(token__lt=lease.token, stats__has_key="task")
    outlived = runs.filter(status__in=(Outcome.ABANDONED, Outcome.UNKNOWN)).exclude(tick=lease.tick)
    for run in outlived.values("pk", "tick", "token", "stats"):
        if JobRun.objects.for_job(lease.job).filter(tick=run["tick"], token__gt=run["token"]).exists():
            continue  # a later attempt of its slot followed the task: that run has its outcome
        try:
            result = task.get_result(run["stats"]["task"])
        except TaskResultDoesNotExist:
            continue
        if result.is_finished:
            failed = result.status == TaskResultStatus.FAILED
            after = f"its task {result.id} finished after the run stopped following it"
            JobRun.objects.filter(pk=run["pk"], token=run["token"]).update(
                status=Outcome.FAILED if failed else Outcome.SUCCEEDED,
                error=_failure(result) if failed else after,
            )
