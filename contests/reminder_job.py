"""The ``send_reminders`` job: reminder delivery run under the cluster-wide lease."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from contests.reminders import ReminderDeliveryError, deliver_due_reminders
from locks import schedule
from locks.api import Lease, RunResult, run_locked

JOB_NAME = "send_reminders"


def current_tick(*, now: datetime | None = None) -> datetime:
    """The slot a run at ``now`` (this host's clock) claims: see ``locks.schedule.current_tick``."""
    return schedule.current_tick(
        settings.SEND_REMINDERS_SCHEDULE,
        now=now or timezone.now(),
        window=timedelta(seconds=settings.LOCKS_TICK_WINDOW),
    )


def send_reminders(lease: Lease) -> dict[str, int]:
    """The job itself, given the lease: what a run under ``run_locked`` calls."""
    return deliver_due_reminders(lease=lease).as_dict()


def run_reminders_job(*, tick: datetime | None = None, force: bool = False) -> RunResult:
    """One scheduled (or forced) run: at most one per tick across every host.

    ``force`` ignores the tick (a manual run) but still needs the lease. Each
    reminder is claimed on its own as well, so even runs that overlap (a lease
    lost mid-run) never send one twice.
    """
    tick = None if force else (tick or current_tick())
    return run_locked(
        job=JOB_NAME,
        tick=tick,
        ttl=timedelta(seconds=settings.SEND_REMINDERS_LOCK_TTL),
        fn=send_reminders,
        expected_errors=(ReminderDeliveryError,),
    )


def preview_reminders() -> dict[str, int]:
    """What a run would do now, without the lease, claiming and sending nothing."""
    return deliver_due_reminders(dry_run=True).as_dict()
