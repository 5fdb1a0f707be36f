"""Is the sync keeping up? Read by ``/healthz``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.utils import timezone

from contests.jobs import JOB_NAME
from locks.schedule import next_tick, previous_slots
from locks.selectors import JobHealth, job_health


@dataclass(frozen=True)
class SyncHealth:
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


def sync_health() -> SyncHealth:
    """Fresh unless two slots passed without a success: the last success is at or
    after the slot before the latest slot, which suits uneven schedules too
    (``0 8,9 * * *`` at 11:00, ``0 9 * * 1-5`` over a weekend).

    Slots are taken at the database's now, like the lock's clock. Raises
    ``DatabaseError`` when the database cannot be read.
    """
    job = job_health(job=JOB_NAME)
    schedule = settings.SYNC_CONTESTS_SCHEDULE
    _latest, before_latest = previous_slots(schedule, now=job.db_now or timezone.now(), count=2)
    return SyncHealth(job=job, schedule=schedule, fresh_since=before_latest)
