"""Reads of lock state, computed against the database clock."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db.models import Count, Max
from django.db.models.functions import Coalesce, Now
from django.utils.translation import gettext

from locks.models import EXPIRED, FREE, HELD, OVERDUE, STUCK_Q, JobRun, SyncLock
from locks.schedule import is_valid_expression, next_tick

__all__ = ["EXPIRED", "FREE", "HELD", "OVERDUE", "JobHealth", "LockState", "job_health", "lock_states"]


@dataclass(frozen=True)
class LockState:
    job: str
    state: str
    holder: str
    token: int
    locked_until: datetime | None
    heartbeat_at: datetime | None
    tick: datetime | None
    last_status: str
    last_started_at: datetime | None
    last_finished_at: datetime | None
    last_error: str
    db_now: datetime

    def as_json(self) -> dict:
        return {
            key: value.isoformat() if isinstance(value, datetime) else value
            for key, value in asdict(self).items()
        }


def lock_states() -> list[LockState]:
    """Every lock with its state, in one query."""
    return [_lock_state_of(row) for row in SyncLock.objects.with_state().order_by("job_name")]


def _lock_state_of(row: SyncLock) -> LockState:
    """``row`` must come from ``SyncLock.objects.with_state()``."""
    return LockState(
        job=row.job_name,
        state=row.state,
        holder=row.holder,
        token=row.token,
        locked_until=row.locked_until,
        heartbeat_at=row.heartbeat_at,
        tick=row.tick,
        last_status=row.last_status,
        last_started_at=row.last_started_at,
        last_finished_at=row.last_finished_at,
        last_error=row.last_error,
        db_now=row.db_now,
    )


@dataclass(frozen=True)
class JobHealth:
    """When ``job`` last succeeded, and its lock, read against the database clock."""

    job: str
    db_now: datetime | None
    last_success_at: datetime | None
    lock: LockState | None

    @property
    def last_success_age(self) -> timedelta | None:
        if self.last_success_at is None or self.db_now is None:
            return None
        return self.db_now - self.last_success_at


def job_health(*, job: str) -> JobHealth:
    """Two queries: the lock row and the newest successful run, each with the database's now."""
    row = SyncLock.objects.for_job(job).with_state().first()
    lock = _lock_state_of(row) if row is not None else None
    success = (
        JobRun.objects.for_job(job)
        .succeeded()
        .filter(finished_at__isnull=False)
        .annotate(db_now=Now())
        .order_by("-finished_at")
        .values_list("finished_at", "db_now")
        .first()
    )
    last_success_at, db_now = success or (None, lock.db_now if lock else None)
    return JobHealth(job=job, db_now=db_now, last_success_at=last_success_at, lock=lock)


# --- the summary above the admin's list of locks ----------------------------------


@dataclass(frozen=True)
class ScheduledJob:
    job: str
    last_success: datetime | None
    next_tick: datetime | None
    error: str = ""


@dataclass(frozen=True)
class Summary:
    jobs: list[ScheduledJob]
    stuck: int
    db_now: datetime


def lock_summary() -> Summary:
    """Last success and next tick of each job in ``LOCKS_SCHEDULES``, and the
    number of stuck locks; one query for the locks and the database's now,
    plus one per scheduled job."""
    # An aggregate answers with one row even when there are no locks yet.
    locks = SyncLock.objects.aggregate(stuck=Count("pk", filter=STUCK_Q), db_now=Coalesce(Max(Now()), Now()))
    db_now = locks["db_now"]
    jobs = []
    for job, expression in getattr(settings, "LOCKS_SCHEDULES", {}).items():
        last = (
            JobRun.objects.for_job(job)
            .succeeded()
            .order_by("-started_at")
            .values_list("finished_at", flat=True)
            .first()
        )
        if not is_valid_expression(expression):
            error = gettext("schedule %(expression)r is not a valid cron expression") % {
                "expression": expression
            }
            jobs.append(ScheduledJob(job, last, None, error))
            continue
        jobs.append(ScheduledJob(job, last, next_tick(expression, now=db_now)))
    return Summary(jobs=jobs, stuck=locks["stuck"], db_now=db_now)


def database_now() -> datetime:
    """The database's clock, in one query. An aggregate answers with one row even
    when the table is empty, so this works before any job has run."""
    return SyncLock.objects.aggregate(now=Max(Now(), default=Now()))["now"]
