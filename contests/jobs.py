"""The ``sync_contests`` job: the sync service run under the cluster-wide lease."""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from django.conf import settings
from django.utils import timezone

from contests.codeforces import CodeforcesClient, CodeforcesError
from contests.services import sync_codeforces_contests
from locks.api import RunResult, run_locked
from locks.schedule import nearest_tick

logger = logging.getLogger(__name__)

JOB_NAME = "sync_contests"


def current_tick(*, now: datetime | None = None) -> datetime:
    return nearest_tick(settings.SYNC_CONTESTS_SCHEDULE, now=now or timezone.now())


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
