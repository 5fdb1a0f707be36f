"""Is the sync keeping up? Read by ``/healthz``."""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta

from django.conf import settings
from django.utils import timezone

from contests.jobs import JOB_NAME
from locks.schedule import period
from locks.selectors import JobHealth, job_health


@dataclass(frozen=True)
class SyncHealth:
    job: JobHealth
    schedule: str
    max_age: timedelta

    @property
    def fresh(self) -> bool:
        age = self.job.last_success_age
        return age is not None and age < self.max_age


def sync_health() -> SyncHealth:
    """The last successful sync must be younger than two schedule periods.

    Ages are measured on the database clock, like the lock's. Raises
    ``DatabaseError`` when the database cannot be read.
    """
    job = job_health(job=JOB_NAME)
    schedule = settings.SYNC_CONTESTS_SCHEDULE
    max_age = 2 * period(schedule, now=job.db_now or timezone.now())
    return SyncHealth(job=job, schedule=schedule, max_age=max_age)
