"""The operator's two writes on a job lock, force release and reset of the claimed tick
(``manage.py locks release`` and the admin's actions, ``locks.actions``, call them).

Like every lease change they are compare-and-sets on the row, judged by the database
clock, and each acts only while the row still shows what the operator saw: the fencing
token, and for a reset the claimed tick (docs/architecture.md, "The rules": 9). Neither
waits on a lock row locked by a write in progress longer than ``OPERATOR_WAIT``.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import router
from django.db.models import F
from django.db.models.functions import Now

from locks.bounds import RowLocked, unlocked, without_waiting
from locks.claims import iso
from locks.leases import LockError
from locks.models import EXPIRED, FREE, HELD, OVERDUE, JobRun, RunStatus, SyncLock
from locks.registry import UnknownJob

# The name the lock's log lines have always carried (operators filter on it).
logger = logging.getLogger("locks.api")
# How long an operator's write waits for a lock row locked by a write in progress.
OPERATOR_WAIT = 5.0
FROZEN_HINT = (
    "nothing changed. A holder frozen inside its fenced write keeps the row locked until its transaction "
    "ends (on PostgreSQL the server ends it within the job's lease TTL): try again then"
)


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
    """What ``reset_tick`` did. ``was_reset``: this call cleared ``previous_tick``; otherwise
    ``detail`` says why not (empty when no tick was claimed)."""

    job: str
    previous_tick: datetime | None
    was_done: bool
    was_reset: bool = False
    detail: str = ""


def force_release(*, job: str, expected_token: int | None = None, by: str = "") -> ForcedRelease:
    """Clear the lease on ``job`` while it is held (by the database clock) and
    bump the fencing token, so the old holder can neither renew nor release it.

    With ``expected_token``, only the lease with that token: the holder an
    operator was shown, not one that took over since. When nothing is
    released, the result's ``detail`` says why; nothing is changed.
    """
    by = by or "unknown"
    using = router.db_for_write(SyncLock)
    return _operator_write(
        lambda: _force_release(job=job, using=using, expected_token=expected_token, by=by),
        using=using,
        what=f"force release of {job}",
    )


def _operator_write(operation, *, using: str, what: str):
    """``operation`` in a transaction that takes the lock row without waiting for a write in
    progress longer than ``OPERATOR_WAIT`` (``RowLocked``, saying so)."""
    try:
        return without_waiting(operation, using=using, within=OPERATOR_WAIT, what=what)
    except RowLocked as exc:
        raise RowLocked(f"{exc}; {FROZEN_HINT}") from exc


def _force_release(*, job: str, using: str, expected_token: int | None, by: str) -> ForcedRelease:
    rows = SyncLock.objects.using(using).for_job(job)
    for _attempt in range(5):
        # Lock the row first (on PostgreSQL; never waiting for a write in progress), then
        # the compare-and-set: the same on backends that lock no rows.
        row = (
            unlocked(rows, using=using, skip=False)
            .with_state()
            .values("holder", "token", "state", "last_status", "locked_until")
            .first()
        )
        if row is None:
            raise _no_lock(job)
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


def _no_lock(job: str) -> UnknownJob:
    """The jobs it names are those with a lock row: a registered job has one from its first run."""
    known = ", ".join(SyncLock.objects.values_list("job_name", flat=True)) or "none yet"
    return UnknownJob(f"no lock named {job!r} (known jobs: {known})")


def _not_held(row: dict) -> str:
    if row["state"] == EXPIRED:
        return (
            f"(its lease expired at {iso(row['locked_until'])} without being released; "
            "the next run takes it over)"
        )
    return f"(finished as {row['last_status'] or 'nothing yet'})"


def reset_tick(
    *,
    job: str,
    expected_tick: datetime | None,
    expected_token: int | None = None,
    expected_done: bool | None = None,
    by: str = "",
) -> TickReset:
    """Forget the tick ``job`` claimed last, its done mark and its attempts, so the next
    scheduled run may claim any tick again (for example after a far-future ``--tick`` was
    stored). Only while the row still shows what the operator saw: the claimed tick
    ``expected_tick`` and, when given, the fencing token and whether the tick was done; else
    nothing changes and the answer's ``detail`` says what is there now. Works whether or not
    the lease is held; it does not release it."""
    by = by or "unknown"
    using = router.db_for_write(SyncLock)
    shown = {"tick": expected_tick, "token": expected_token, "tick_done": expected_done}
    return _operator_write(
        lambda: _reset_tick(job=job, using=using, shown=shown, by=by),
        using=using,
        what=f"tick reset of {job}",
    )


def _reset_tick(*, job: str, using: str, shown: dict, by: str) -> TickReset:
    rows = SyncLock.objects.using(using).for_job(job)
    row = unlocked(rows, using=using, skip=False).values("token", "tick", "tick_done").first()
    if row is None:
        raise _no_lock(job)
    tick, done = row["tick"], row["tick_done"]
    if tick is None:
        return TickReset(job, None, False)
    state = "done" if done else "not done"
    detail = ""
    if tick != shown["tick"]:
        detail = f"the claimed tick of {job} is now {iso(tick)} ({state}), not the {iso(shown['tick'])} shown"
    elif shown["tick_done"] is not None and done != shown["tick_done"]:
        detail = f"the claimed tick {iso(tick)} of {job} is {state} now, unlike what was shown"
    elif shown["token"] is not None and row["token"] != shown["token"]:
        detail = f"lease on {job} is now token {row['token']}, not the {shown['token']} shown"
    # Compare-and-set on what was read (the row is locked meanwhile where the database can).
    if detail or not rows.filter(**row).update(tick=None, tick_done=False, tick_attempts=0, retry_at=None):
        return TickReset(
            job, tick, done, detail=f"{detail or 'the lock row changed meanwhile'}; nothing reset"
        )
    logger.warning("job=%s claimed tick reset by %s; it was %s (%s)", job, by, iso(tick), state)
    return TickReset(job, tick, done, was_reset=True)
