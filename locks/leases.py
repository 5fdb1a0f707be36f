"""Leases: the only code that writes ``SyncLock`` rows.

Every state change is one conditional UPDATE (compare-and-set) evaluated by the
database against its own clock (``Now()``), so hosts with skewed clocks agree on
expiry and no read-then-write race exists. See docs/architecture.md, The lock.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from django.conf import settings
from django.db import IntegrityError, connections, router, transaction
from django.db.models import DateTimeField, ExpressionWrapper, F, Q, Value
from django.db.models.functions import Now
from django.utils import timezone

from locks.models import JobRun, RunStatus, SyncLock

# The name the lock's log lines have always carried (operators filter on it).
logger = logging.getLogger("locks.api")


class LockError(Exception):
    """The lock cannot be used at all (for example, its table is missing)."""


class LockLost(RuntimeError):
    """The lease was taken over or could not be renewed; stop before writing."""


class UnknownJob(LookupError):
    pass


def make_holder() -> str:
    """host:pid:suffix; the suffix tells apart two processes that reuse a pid."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def validate_ttl(ttl: timedelta) -> timedelta:
    if not isinstance(ttl, timedelta):
        raise TypeError(f"ttl must be a timedelta, got {type(ttl).__name__}")
    if ttl <= timedelta(0):
        raise ValueError(f"ttl must be positive, got {ttl}")
    return ttl


def _expires(ttl: timedelta) -> ExpressionWrapper:
    return ExpressionWrapper(Now() + Value(ttl), output_field=DateTimeField())


def iso(value: datetime | None) -> str:
    return value.isoformat() if value is not None else ""


@dataclass(frozen=True)
class Skip:
    """Why a contender did not get the lease."""

    job: str
    tick: datetime | None
    reason: Literal["held", "tick_claimed"]
    holder: str
    locked_until: datetime | None
    claimed_tick: datetime | None

    def __str__(self) -> str:
        if self.reason == "held":
            return f"held by {self.holder} until {iso(self.locked_until)}"
        return f"tick {iso(self.claimed_tick)} already claimed by {self.holder}"


@dataclass
class Lease:
    """A lease this process holds. ``token`` is the fencing number."""

    job: str
    holder: str
    token: int
    tick: datetime | None
    ttl: timedelta
    acquired_at: datetime
    lost_reason: str = ""
    _lost: threading.Event = field(default_factory=threading.Event, repr=False)

    @property
    def lost(self) -> bool:
        return self._lost.is_set()

    def mark_lost(self, reason: str) -> None:
        self.lost_reason = reason
        self._lost.set()

    def check(self) -> None:
        """Raise ``LockLost`` if the heartbeat found the lease gone."""
        if self.lost:
            raise LockLost(self.lost_reason)


@dataclass(frozen=True)
class ForcedRelease:
    job: str
    previous_holder: str
    previous_token: int
    was_held: bool
    token: int


def acquire(*, job: str, tick: datetime | None, ttl: timedelta, holder: str | None = None) -> Lease | Skip:
    """Take the lease on ``job`` for ``tick`` (None: any tick, a forced run).

    One compare-and-set: it wins only if the lease is free by the database
    clock and, for a scheduled run, no run has claimed this tick or a later one.
    The winner reads its token back in the same transaction, so the read sees
    the state its UPDATE made (on MongoDB, where ``atomic()`` is a no-op, the
    read matches on this holder).
    """
    validate_ttl(ttl)
    holder = holder or make_holder()
    db = router.db_for_write(SyncLock)
    rows = SyncLock.objects.using(db).for_job(job)
    claim = rows.free()
    values = {
        "holder": holder,
        "token": F("token") + 1,
        "acquired_at": Now(),
        "locked_until": _expires(ttl),
        "heartbeat_at": Now(),
        "last_started_at": Now(),
        "last_status": RunStatus.RUNNING,
        "last_error": "",
    }
    if tick is not None:
        values["tick"] = tick
        claim = claim.filter(Q(tick__isnull=True) | Q(tick__lt=tick))
    for _attempt in range(3):
        # No savepoint: nothing here catches an error, so a caller's transaction
        # (if any) is simply joined.
        with transaction.atomic(using=db, savepoint=False):
            won = None
            if claim.update(**values):
                won = rows.filter(holder=holder).values_list("token", "acquired_at").first()
        if won is not None:
            token, acquired_at = won
            _warn_on_skew(job=job, db_now=acquired_at)
            return Lease(job=job, holder=holder, token=token, tick=tick, ttl=ttl, acquired_at=acquired_at)
        state = rows.annotate(db_now=Now()).values("holder", "locked_until", "tick", "db_now").first()
        if state is None:
            _create(job=job)
            continue  # the row exists now: compete on it
        _warn_on_skew(job=job, db_now=state["db_now"])
        if state["locked_until"] is not None and state["locked_until"] >= state["db_now"]:
            return Skip(job, tick, "held", state["holder"], state["locked_until"], state["tick"])
        if tick is not None and state["tick"] is not None and state["tick"] >= tick:
            claimant = state["holder"] or _tick_claimant(job=job, tick=state["tick"])
            return Skip(job, tick, "tick_claimed", claimant, state["locked_until"], state["tick"])
        # The holder released between our UPDATE and our read: try again.
    if state is None:
        raise LockError(f"the lock row for {job!r} keeps disappearing; is something deleting it?")
    return Skip(job, tick, "held", state["holder"], state["locked_until"], state["tick"])


def _tick_claimant(*, job: str, tick: datetime) -> str:
    """Who ran ``tick``, once its lease is released (released rows keep no holder)."""
    holder = JobRun.objects.for_job(job).filter(tick=tick).values_list("holder", flat=True).first()
    return holder or "an earlier run"


def _create(*, job: str) -> None:
    """First use of a job: insert its row, free, for the compare-and-set to
    claim. A unique-key clash means another contender inserted it first,
    which serves as well. Plain values only: MongoDB cannot insert
    expressions such as ``Now()``."""
    using = router.db_for_write(SyncLock)
    table = SyncLock._meta.db_table
    if table not in connections[using].introspection.table_names():
        # MongoDB would create the collection on insert, without the unique
        # index on job_name that makes this insert, and so the lock, safe.
        raise LockError(f"the lock table {table} is missing: run `python manage.py migrate`")
    try:
        with transaction.atomic(using=using):
            SyncLock.objects.create(job_name=job)
    except IntegrityError:
        pass


def _warn_on_skew(*, job: str, db_now: datetime | None) -> None:
    if db_now is None:
        return
    skew = (timezone.now() - db_now).total_seconds()
    limit = getattr(settings, "LOCKS_MAX_CLOCK_SKEW", 120)
    if abs(skew) > limit:
        logger.warning(
            "job=%s host clock is %+.0f s off the database clock (more than %s s): "
            "ticks are named from the host clock, so this host may name a different slot; "
            "fix NTP on %s",
            job,
            skew,
            limit,
            socket.gethostname(),
        )


def renew(*, lease: Lease) -> None:
    """Extend ``lease`` by its TTL from the database's now, or raise ``LockLost``.

    Matches on the fencing token: a lease that was taken over or force-released
    (both bump the token) cannot be extended.
    """
    updated = SyncLock.objects.filter(
        job_name=lease.job, token=lease.token, locked_until__isnull=False
    ).update(locked_until=_expires(lease.ttl), heartbeat_at=Now())
    if not updated:
        reason = f"lease on {lease.job} (token {lease.token}) was taken over or released"
        lease.mark_lost(reason)
        raise LockLost(reason)


def release(*, lease: Lease, status: str, error: str = "") -> bool:
    """Give the lease back, recording the outcome. Only the holder's token matches.

    A released row keeps no holder (a holder always has an expiry); the run's
    holder stays on its JobRun.
    """
    return bool(
        SyncLock.objects.filter(job_name=lease.job, token=lease.token).update(
            holder="",
            locked_until=None,
            last_finished_at=Now(),
            last_status=status,
            last_error=error[:2000],
        )
    )


def force_release(*, job: str, by: str = "") -> ForcedRelease:
    """Clear the lease on ``job`` whoever holds it, and bump the fencing token
    so the old holder can neither renew nor release any more."""
    by = by or "unknown"
    for _attempt in range(5):
        row = SyncLock.objects.for_job(job).values("holder", "token", "locked_until").first()
        if row is None:
            known = ", ".join(SyncLock.objects.values_list("job_name", flat=True)) or "none yet"
            raise UnknownJob(f"no lock named {job!r} (known jobs: {known})")
        holder, token = row["holder"], row["token"]
        if row["locked_until"] is None:
            return ForcedRelease(job, holder, token, False, token)
        # Compare-and-set on the token we read: a new holder in between is not released.
        if SyncLock.objects.filter(job_name=job, token=token).update(
            holder="",
            locked_until=None,
            token=F("token") + 1,
            last_finished_at=Now(),
            last_status=RunStatus.RELEASED,
            last_error=f"force-released by {by}; holder was {holder}",
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
