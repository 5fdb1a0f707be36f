"""The read side, on the database clock: lock states (``locks status``), job health and
freshness (``/healthz``), the admin's summary line."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timedelta

from django.core.exceptions import ImproperlyConfigured
from django.db.models import Count, Max
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from locks.claims import iso
from locks.models import STUCK_Q, JobRun, SyncLock
from locks.registry import jobs as registered_jobs
from locks.schedule import next_tick, previous_slots

# A registered job without a lock row: it creates its lock on its first run.
NEVER_RUN = "never run"


@dataclass(frozen=True)
class LockState:
    job: str
    state: str
    holder: str
    token: int | None  # None: never run
    locked_until: datetime | None
    heartbeat_at: datetime | None
    tick: datetime | None
    last_status: str
    last_started_at: datetime | None
    last_finished_at: datetime | None
    last_error: str
    db_now: datetime | None
    paused_at: datetime | None = None  # an operator's pause (locks.pausing)
    paused_by: str = ""
    paused_note: str = ""

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    def as_json(self) -> dict:
        values = {
            key: iso(value) if isinstance(value, datetime) else value for key, value in asdict(self).items()
        }
        return {**values, "paused": self.paused}


def lock_states() -> list[LockState]:
    """Every lock with its state, in one query."""
    return [_lock_state_of(row) for row in SyncLock.objects.with_state().order_by("job_name")]


def job_states() -> list[LockState]:
    """Every lock, and every job in ``LOCKS_JOBS`` that never ran, by job name; one query."""
    states = {state.job: state for state in lock_states()}
    for name in registered_jobs():
        states.setdefault(name, _never_run(name))
    return [states[name] for name in sorted(states)]


def _never_run(job: str) -> LockState:
    return LockState(job, NEVER_RUN, "", None, None, None, None, "", None, None, "", None)


def _lock_state_of(row: SyncLock) -> LockState:
    """``row`` must come from ``SyncLock.objects.with_state()``: every other field is its namesake."""
    values = {field.name: getattr(row, field.name) for field in fields(LockState) if field.name != "job"}
    return LockState(job=row.job_name, **values)


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
    return jobs_health(jobs=[job])[job]


def jobs_health(*, jobs: Iterable[str]) -> dict[str, JobHealth]:
    """Two queries whatever the number of jobs: their lock rows, and each one's last
    success (the newest end of a succeeded run: the one definition), with the database's now."""
    jobs = list(jobs)
    locks = {
        row.job_name: _lock_state_of(row) for row in SyncLock.objects.filter(job_name__in=jobs).with_state()
    }
    successes = {
        row["job_name"]: row
        for row in JobRun.objects.filter(job_name__in=jobs, finished_at__isnull=False)
        .succeeded()
        .order_by()
        .values("job_name")
        .annotate(last_success_at=Max("finished_at"), db_now=Max(Now()))
    }
    any_now = next(
        (row["db_now"] for row in successes.values()),
        next((lock.db_now for lock in locks.values()), None),
    )
    health = {}
    for job in jobs:
        success = successes.get(job, {})
        health[job] = JobHealth(
            job=job,
            db_now=success.get("db_now") or any_now,
            last_success_at=success.get("last_success_at"),
            lock=locks.get(job),
        )
    return health


# --- freshness (/healthz) --------------------------------------------------------------


@dataclass(frozen=True)
class Freshness:
    job: JobHealth
    schedule: str
    # The oldest success that still counts as fresh: the slot before the latest
    # slot at or before the database's now.
    fresh_since: datetime

    @property
    def fresh(self) -> bool:
        return self.job.last_success_at is not None and self.job.last_success_at >= self.fresh_since

    @property
    def stale_after(self) -> datetime | None:
        """When the last success stops being fresh: at the second slot after it."""
        if self.job.last_success_at is None:
            return None
        return next_tick(self.schedule, now=next_tick(self.schedule, now=self.job.last_success_at))


def jobs_freshness() -> dict[str, Freshness]:
    """Each job of ``LOCKS_JOBS``: fresh unless two of its slots passed without a
    success, that is, its last success is at or after the slot before its latest
    slot, which suits uneven schedules too (``0 8,9 * * *`` at 11:00, ``0 9 * * 1-5``
    over a weekend).

    Slots are taken at the database's now, like the lock's clock; two queries
    whatever the number of jobs. Raises ``DatabaseError`` when the database cannot
    be read.
    """
    registered = registered_jobs()
    health = jobs_health(jobs=registered)
    freshness = {}
    for name, job in registered.items():
        now = health[name].db_now or timezone.now()
        _latest, before_latest = previous_slots(job.schedule, now=now, count=2)
        freshness[name] = Freshness(job=health[name], schedule=job.schedule, fresh_since=before_latest)
    return freshness


# --- the summary above the admin's list of locks ----------------------------------


@dataclass(frozen=True)
class ScheduledJob:
    job: str
    last_success: datetime | None
    next_tick: datetime


@dataclass(frozen=True)
class Summary:
    jobs: list[ScheduledJob]
    stuck: int
    db_now: datetime
    error: str = ""  # LOCKS_JOBS is invalid: the jobs cannot be listed


def lock_summary() -> Summary:
    """Last success and next tick of each job in ``LOCKS_JOBS``, and the number of
    stuck locks; three queries whatever the number of jobs."""
    # An aggregate answers with one row even when there are no locks yet.
    locks = SyncLock.objects.aggregate(stuck=Count("pk", filter=STUCK_Q), db_now=Coalesce(Max(Now()), Now()))
    db_now = locks["db_now"]
    try:
        registered = registered_jobs()
    except ImproperlyConfigured as exc:  # the page still shows the locks, and why no jobs
        return Summary(jobs=[], stuck=locks["stuck"], db_now=db_now, error=str(exc))
    health = jobs_health(jobs=registered)
    jobs = [
        ScheduledJob(name, health[name].last_success_at, next_tick(job.schedule, now=db_now))
        for name, job in registered.items()
    ]
    return Summary(jobs=jobs, stuck=locks["stuck"], db_now=db_now)
