"""The ``sync_contests`` job: the sync service run under the cluster-wide lease."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.utils import timezone

from contests.codeforces import CodeforcesClient, CodeforcesError
from contests.services import sync_codeforces_contests
from locks import schedule
from locks.api import RunResult, run_locked
from locks.selectors import database_now

logger = logging.getLogger(__name__)

JOB_NAME = "sync_contests"


class InvalidTick(ValueError):
    """A ``--tick`` that is no slot of the schedule, or too far ahead."""


def current_tick(*, now: datetime | None = None) -> datetime:
    """The slot a run at ``now`` (this host's clock) claims: see ``locks.schedule.current_tick``."""
    return schedule.current_tick(
        settings.SYNC_CONTESTS_SCHEDULE,
        now=now or timezone.now(),
        window=timedelta(seconds=settings.LOCKS_TICK_WINDOW),
    )


def checked_tick(tick: datetime) -> datetime:
    """``tick`` in UTC, if a run may claim it: a slot of the schedule, at most one
    period ahead of the database clock (a tick further ahead would make every real
    tick look already claimed until it arrives).

    Raises ``InvalidTick`` naming the nearest valid slots, or ``DatabaseError``
    when the database clock cannot be read.
    """
    expression = settings.SYNC_CONTESTS_SCHEDULE
    tick = tick.astimezone(UTC)
    db_now = database_now()
    ahead = schedule.period(expression, now=db_now)
    if tick > db_now + ahead:
        latest = schedule.slot_at_or_before(expression, now=db_now + ahead)
        raise InvalidTick(
            f"tick {tick.isoformat()} is more than one schedule period ({ahead}) ahead of the "
            f"database clock ({db_now.isoformat(timespec='seconds')}); the latest slot it may name "
            f"is {latest.isoformat()}, the one a run claims now is {current_tick(now=db_now).isoformat()}"
        )
    if not schedule.is_slot(expression, tick):
        before = schedule.slot_at_or_before(expression, now=tick)
        after = schedule.next_tick(expression, now=tick)
        nearest = (
            f"the nearest valid slots are {before.isoformat()} and {after.isoformat()}"
            if after <= db_now + ahead
            else f"the nearest valid slot is {before.isoformat()} (the next, {after.isoformat()}, is too far ahead)"
        )
        raise InvalidTick(
            f"tick {tick.isoformat()} is not a slot of the schedule {expression!r} (UTC); {nearest}"
        )
    return tick


def run_sync_job(
    *,
    tick: datetime | None = None,
    force: bool = False,
    client: CodeforcesClient | None = None,
) -> RunResult:
    """One scheduled (or forced) run: at most one per tick across every host.

    ``force`` ignores the tick (a manual run) but still needs the lease.
    """
    client = client or CodeforcesClient()
    tick = None if force else (tick or current_tick())
    return run_locked(
        job=JOB_NAME,
        tick=tick,
        ttl=timedelta(seconds=settings.SYNC_CONTESTS_LOCK_TTL),
        fn=lambda lease: sync_codeforces_contests(client=client, lease=lease).as_dict(),
        expected_errors=(CodeforcesError,),
    )


def preview_sync(*, client: CodeforcesClient | None = None) -> dict[str, int]:
    """What a sync would write now, without the lease and without writing."""
    return sync_codeforces_contests(client=client or CodeforcesClient(), dry_run=True).as_dict()
