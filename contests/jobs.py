"""The ``sync_contests`` job: the sync service run under the cluster-wide lease."""

from __future__ import annotations

import logging
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.utils import timezone

from contests.codeforces import CodeforcesClient, CodeforcesError
from contests.services import sync_codeforces_contests
from locks import schedule
from locks.api import RunResult, Skip, run_locked

logger = logging.getLogger(__name__)

JOB_NAME = "sync_contests"


class InvalidTick(ValueError):
    """A ``--tick`` that is no slot of the schedule."""


def current_tick(*, now: datetime | None = None) -> datetime:
    """The slot a run at ``now`` (this host's clock) claims: see ``locks.schedule.current_tick``."""
    return schedule.current_tick(
        settings.SYNC_CONTESTS_SCHEDULE,
        now=now or timezone.now(),
        window=timedelta(seconds=settings.LOCKS_TICK_WINDOW),
    )


def checked_tick(tick: datetime) -> datetime:
    """``tick`` in UTC, if it is a slot of the schedule; else ``InvalidTick``
    naming the nearest slots. How far ahead it may lie is the lock's to judge,
    on the database clock (``run_sync_job``'s horizon; ``tick_ahead_message``)."""
    expression = settings.SYNC_CONTESTS_SCHEDULE
    tick = tick.astimezone(UTC)
    if not schedule.is_slot(expression, tick):
        before = schedule.slot_at_or_before(expression, now=tick)
        after = schedule.next_tick(expression, now=tick)
        raise InvalidTick(
            f"tick {tick.isoformat()} is not a slot of the schedule {expression!r} (UTC); "
            f"the nearest valid slots are {before.isoformat()} and {after.isoformat()}"
        )
    return tick


def tick_ahead_message(skip: Skip) -> str:
    """Why a tick was refused as too far ahead, with the slots a run may name."""
    db_now = skip.db_now
    latest = schedule.slot_at_or_before(settings.SYNC_CONTESTS_SCHEDULE, now=db_now + skip.horizon)
    return (
        f"tick {skip.tick.isoformat()} is more than one schedule period ({skip.horizon}) ahead of the "
        f"database clock ({db_now.isoformat(timespec='seconds')}); the latest slot it may name "
        f"is {latest.isoformat()}, the one a run claims now is {current_tick(now=db_now).isoformat()}"
    )


def run_sync_job(
    *,
    tick: datetime | None = None,
    force: bool = False,
    client: CodeforcesClient | None = None,
) -> RunResult:
    """One scheduled (or forced) run: at most one success per tick across every host.

    ``force`` ignores the tick (a manual run) but still needs the lease. A tick
    more than one period of the schedule ahead of the database clock is refused.
    """
    client = client or CodeforcesClient()
    now = timezone.now()
    tick = None if force else (tick or current_tick(now=now))
    return run_locked(
        job=JOB_NAME,
        tick=tick,
        ttl=timedelta(seconds=settings.SYNC_CONTESTS_LOCK_TTL),
        # The period around now, not around the tick: on an uneven schedule the
        # upcoming slot can lie further ahead than the gap that follows it.
        horizon=schedule.period(settings.SYNC_CONTESTS_SCHEDULE, now=now),
        max_run_time=timedelta(seconds=settings.SYNC_CONTESTS_MAX_RUN_TIME),
        fn=lambda lease: sync_codeforces_contests(client=client, lease=lease).as_dict(),
        expected_errors=(CodeforcesError,),
    )


def preview_sync(*, client: CodeforcesClient | None = None) -> dict[str, int]:
    """What a sync would write now, without the lease and without writing."""
    return sync_codeforces_contests(client=client or CodeforcesClient(), dry_run=True).as_dict()
