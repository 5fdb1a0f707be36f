"""Reads of lock state, computed against the database clock."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from django.db.models import Max
from django.db.models.functions import Now

from locks.models import JobRun, SyncLock

FREE, HELD, EXPIRED, OVERDUE = "free", "held", "expired", "heartbeat overdue"


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


def lock_state(*, locked_until, heartbeat_at, db_now) -> str:
    """free · held · expired (holder gone, lease not released) · heartbeat overdue.

    A renewal sets ``locked_until = heartbeat_at + ttl``, so the TTL can be read
    back from the row; a holder that missed two beats (2/3 of the TTL) is overdue.
    """
    if locked_until is None:
        return FREE
    if locked_until < db_now:
        return EXPIRED
    if heartbeat_at is not None:
        ttl = locked_until - heartbeat_at
        if ttl > timedelta(0) and db_now - heartbeat_at > ttl * 2 / 3:
            return OVERDUE
    return HELD


def lock_states() -> list[LockState]:
    """Every lock with its state, in one query."""
    rows = SyncLock.objects.annotate(db_now=Now()).order_by("job_name")
    return [_lock_state_of(row) for row in rows]


def _lock_state_of(row: SyncLock) -> LockState:
    """``row`` must carry a ``db_now`` annotation."""
    return LockState(
        job=row.job_name,
        state=lock_state(locked_until=row.locked_until, heartbeat_at=row.heartbeat_at, db_now=row.db_now),
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
    row = SyncLock.objects.for_job(job).annotate(db_now=Now()).first()
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


def database_now() -> datetime:
    """The database's clock, in one query. An aggregate answers with one row even
    when the table is empty, so this works before any job has run."""
    return SyncLock.objects.aggregate(now=Max(Now(), default=Now()))["now"]
