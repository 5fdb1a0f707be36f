"""Reads of lock state, computed against the database clock."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from datetime import datetime, timedelta

from django.db.models.functions import Now

from locks.models import SyncLock

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
    return [
        LockState(
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
        for row in rows
    ]
