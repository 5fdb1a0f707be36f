"""Is each registered job keeping up? Read by ``/healthz``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime

from django.utils import timezone

from locks.registry import jobs
from locks.schedule import next_tick, previous_slots
from locks.selectors import JobHealth, jobs_health


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
    registered = jobs()
    health = jobs_health(jobs=registered)
    freshness = {}
    for name, job in registered.items():
        now = health[name].db_now or timezone.now()
        _latest, before_latest = previous_slots(job.schedule, now=now, count=2)
        freshness[name] = Freshness(job=health[name], schedule=job.schedule, fresh_since=before_latest)
    return freshness
