"""The operator's two writes on a job lock: force release and reset of the claimed tick.

``manage.py locks release`` and the admin's actions call them. Like every lease
change they are compare-and-sets on the row, judged by the database clock
(docs/architecture.md, The lock).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db.models import F
from django.db.models.functions import Now

from locks.leases import LockError, UnknownJob, iso
from locks.models import EXPIRED, FREE, HELD, OVERDUE, JobRun, RunStatus, SyncLock

# The name the lock's log lines have always carried (operators filter on it).
logger = logging.getLogger("locks.api")


@dataclass(frozen=True)
class ForcedRelease:
    """What ``force_release`` did. ``was_held``: this call released the lease;
    otherwise ``detail`` says why not (empty when the lease was simply free)."""

    job: str
    previous_holder: str
    previous_token: int
    was_held: bool
    token: int
    detail: str = ""


@dataclass(frozen=True)
class TickReset:
    job: str
    previous_tick: datetime | None
    was_done: bool

    @property
    def was_set(self) -> bool:
        return self.previous_tick is not None


def force_release(*, job: str, expected_token: int | None = None, by: str = "") -> ForcedRelease:
    """Clear the lease on ``job`` while it is held (by the database clock) and
    bump the fencing token, so the old holder can neither renew nor release it.

    With ``expected_token``, only the lease with that token: the holder an
    operator was shown, not one that took over since. When nothing is
    released, the result's ``detail`` says why; nothing is changed.
    """
    by = by or "unknown"
    rows = SyncLock.objects.for_job(job)
    for _attempt in range(5):
        row = rows.with_state().values("holder", "token", "state", "last_status", "locked_until").first()
        if row is None:
            known = ", ".join(SyncLock.objects.values_list("job_name", flat=True)) or "none yet"
            raise UnknownJob(f"no lock named {job!r} (known jobs: {known})")
        holder, token = row["holder"], row["token"]
        if expected_token is not None and token != expected_token:
            now = f" held by {holder}" if row["state"] in {HELD, OVERDUE} else f", not held {_not_held(row)}"
            detail = f"lease on {job} is now token {token}{now}; nothing released"
            return ForcedRelease(job, holder, token, False, token, detail)
        if row["state"] not in {HELD, OVERDUE}:
            detail = (
                ""
                if expected_token is None and row["state"] == FREE
                else (
                    f"lease on {job} (token {token}) is not held any more {_not_held(row)}; nothing released"
                )
            )
            return ForcedRelease(job, holder, token, False, token, detail)
        # Compare-and-set on the token we read, while still held: a new holder in
        # between, or a holder that finished meanwhile, is not released.
        if (
            rows.filter(token=token)
            .held()
            .update(
                holder="",
                locked_until=None,
                token=F("token") + 1,
                last_finished_at=Now(),
                last_status=RunStatus.RELEASED,
                last_error=f"force-released by {by}; holder was {holder}",
            )
        ):
            # The released holder's run can no longer finish under its lease; if the
            # holder is alive its own bookkeeping may still overwrite this.
            JobRun.objects.for_job(job).filter(token=token, status=RunStatus.RUNNING).update(
                status=RunStatus.LOST_LOCK, finished_at=Now(), error=f"force-released by {by}"
            )
            logger.warning(
                "job=%s force-released by %s; previous holder %s (token %s), new token %s",
                job,
                by,
                holder,
                token,
                token + 1,
            )
            return ForcedRelease(job, holder, token, True, token + 1)
    raise LockError(f"lock {job!r} kept changing while it was being released; try again")


def _not_held(row: dict) -> str:
    if row["state"] == EXPIRED:
        return (
            f"(its lease expired at {iso(row['locked_until'])} without being released; "
            "the next run takes it over)"
        )
    return f"(finished as {row['last_status'] or 'nothing yet'})"


def reset_tick(*, job: str, by: str = "") -> TickReset:
    """Forget the tick ``job`` claimed last, so the next scheduled run may claim
    any tick again (for example after a far-future ``--tick`` was stored). Works
    whether or not the lease is held; it does not release it."""
    by = by or "unknown"
    rows = SyncLock.objects.for_job(job)
    for _attempt in range(5):
        row = rows.values("token", "tick", "tick_done").first()
        if row is None:
            known = ", ".join(SyncLock.objects.values_list("job_name", flat=True)) or "none yet"
            raise UnknownJob(f"no lock named {job!r} (known jobs: {known})")
        if row["tick"] is None:
            return TickReset(job, None, False)
        # Compare-and-set on what we read: a run that claimed a tick in between is
        # not undone without the operator seeing it.
        if rows.filter(**row).update(tick=None, tick_done=False):
            logger.warning(
                "job=%s claimed tick reset by %s; it was %s (%s)",
                job,
                by,
                iso(row["tick"]),
                "done" if row["tick_done"] else "not done",
            )
            return TickReset(job, row["tick"], row["tick_done"])
    raise LockError(f"lock {job!r} kept changing while its tick was being reset; try again")
