"""The jobs a project registers in ``LOCKS_JOBS``, and running one under its lease.

``LOCKS_JOBS`` is the one list of jobs: django-crontab's ``CRONJOBS``, the admin's
summary, ``locks status``, ``/healthz``, the HTTP trigger and ``run_job`` all read it
(docs/jobs.md). Dotted paths are imported only when a job runs, so reading the
registry never imports the apps whose jobs it runs.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone
from django.utils.module_loading import import_string

from locks import schedule
from locks.api import Lease, RunResult, UnknownJob, run_locked
from locks.checks import job_setting_errors
from locks.schedule import InvalidTick

__all__ = ["InvalidTick", "Job", "NoDryRun", "UnknownJob", "get_job", "jobs", "preview_job", "run_job"]


class NoDryRun(ValueError):
    """The job names no ``dry_run`` callable."""


@dataclass(frozen=True)
class Job:
    name: str
    schedule: str  # cron expression, read in UTC
    callable_path: str  # receives the lease, returns a mapping of counts or None
    ttl: timedelta
    # How long the heartbeat keeps renewing one run's lease; None: as long as it runs.
    max_run_time: timedelta | None
    retry_delays: tuple[timedelta, ...]  # after a failed tick (the scheduler's business)
    expected_errors: tuple[str, ...] = ()  # logged without a traceback
    dry_run_path: str | None = None  # no arguments, returns what a run would do

    def function(self) -> Callable[[Lease], Mapping | None]:
        return import_string(self.callable_path)

    def error_classes(self) -> tuple[type[BaseException], ...]:
        return tuple(import_string(path) for path in self.expected_errors)

    def current_tick(self, *, now: datetime | None = None) -> datetime:
        """The slot a run at ``now`` (this host's clock) claims (``locks.schedule.current_tick``)."""
        return schedule.current_tick(self.schedule, now=now or timezone.now(), window=_tick_window())


def jobs() -> dict[str, Job]:
    """Every registered job, by name, in the order of ``LOCKS_JOBS``.

    Raises ``ImproperlyConfigured`` for a setting the system checks refuse (its first
    problem; ``manage.py check`` lists them all).
    """
    setting = getattr(settings, "LOCKS_JOBS", {})
    errors = job_setting_errors(setting, imports=False)
    if errors:
        more = f" (and {len(errors) - 1} more: run `python manage.py check`)" if len(errors) > 1 else ""
        raise ImproperlyConfigured(f"{errors[0].msg}{more}")
    return {name: _job(name, entry) for name, entry in setting.items()}


def _job(name: str, entry: dict) -> Job:
    max_run_time = entry.get("max_run_time")
    return Job(
        name=name,
        schedule=entry["schedule"],
        callable_path=entry["callable"],
        ttl=timedelta(seconds=entry.get("ttl", settings.LOCKS_DEFAULT_TTL)),
        max_run_time=timedelta(seconds=max_run_time) if max_run_time is not None else None,
        retry_delays=tuple(timedelta(seconds=s) for s in entry.get("retry", {}).get("delays", ())),
        expected_errors=tuple(entry.get("expected_errors", ())),
        dry_run_path=entry.get("dry_run"),
    )


def get_job(name: str) -> Job:
    registered = jobs()
    try:
        return registered[name]
    except KeyError:
        known = ", ".join(registered) or "none"
        raise UnknownJob(f"no job named {name!r} in LOCKS_JOBS (registered: {known})") from None


def run_job(*, name: str, tick: datetime | None = None, force: bool = False) -> RunResult:
    """One run of the job ``name`` under its lease: at most one success per tick across
    every host. The one way a registered job is run (run_job and its aliases, the
    trigger, the scheduler).

    ``tick``: the slot to claim, else the current one. ``force`` ignores slots (a
    manual run) but still needs the lease. Raises ``UnknownJob``; ``InvalidTick`` for
    a ``tick`` that is no slot, or that the lease refused as more than one schedule
    period ahead of the database clock (a current tick so refused is a skip: this
    host's clock is fast); ``LockError`` when the lock table is missing.
    """
    job = get_job(name)
    if force and tick is not None:
        raise InvalidTick("force and tick exclude each other: a forced run claims no tick")
    explicit = tick is not None
    now = timezone.now()
    if explicit:
        tick = schedule.check_tick(job.schedule, tick)
    elif not force:
        tick = job.current_tick(now=now)
    result = run_locked(
        job=job.name,
        tick=tick,
        ttl=job.ttl,
        fn=job.function(),
        expected_errors=job.error_classes(),
        # The period around now, not around the tick: on an uneven schedule the
        # upcoming slot can lie further ahead than the gap that follows it.
        horizon=schedule.period(job.schedule, now=now),
        max_run_time=job.max_run_time,
    )
    skip = result.skip
    if explicit and skip is not None and skip.reason == "tick_ahead":
        raise InvalidTick(
            schedule.tick_ahead_message(
                job.schedule, tick, db_now=skip.db_now, horizon=skip.horizon, window=_tick_window()
            )
        )
    return result


def preview_job(*, name: str) -> dict:
    """What a run of ``name`` would do now, from its ``dry_run`` callable: no lease, no writes."""
    job = get_job(name)
    if job.dry_run_path is None:
        raise NoDryRun(f"job {name!r} has no dry run (no 'dry_run' in its LOCKS_JOBS entry)")
    return dict(import_string(job.dry_run_path)() or {})


def _tick_window() -> timedelta:
    return timedelta(seconds=settings.LOCKS_TICK_WINDOW)
