"""Leases: acquire, renew, the fenced write phase, release. With the operator's force
release and tick reset (``locks.operations``), the only code that writes ``SyncLock`` rows.

Every state change is one conditional UPDATE (compare-and-set) evaluated by the
database against its own clock (``Now()``), so hosts with skewed clocks agree on
expiry and no read-then-write race exists (docs/architecture.md, "The lock").
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import partial
from typing import Literal

from django.conf import settings
from django.db import Error, IntegrityError, connections, router, transaction
from django.db.models import F, Q, Value
from django.db.models.functions import Now
from django.db.models.lookups import GreaterThanOrEqual
from django.utils import timezone

from locks.models import PAUSE_FIELDS, JobRun, RunStatus, SyncLock, database_now, now_plus
from locks.text import error_text

# The name the lock's log lines have always carried (operators filter on it).
logger = logging.getLogger("locks.api")


class LockError(Exception):
    """The lock cannot be used at all (for example, its table is missing)."""


class LockLost(RuntimeError):
    """The lease was taken over or could not be renewed; stop before writing."""


class CommitUnknown(RuntimeError):
    """The COMMIT of a fenced write got no answer and the lock row could not be read back
    to tell whether it committed (docs/architecture.md, "The rules": 10, unknown is not failed)."""


# How long a run whose COMMIT answer was lost keeps trying to read the lock row back
# (at most its TTL): the row stays locked until the server has ended that transaction.
READ_BACK_SECONDS = 30


def make_holder() -> str:
    """host:pid:suffix; the suffix tells apart two processes that reuse a pid."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def validate_ttl(ttl: timedelta) -> timedelta:
    if not isinstance(ttl, timedelta):
        raise TypeError(f"ttl must be a timedelta, got {type(ttl).__name__}")
    if ttl <= timedelta(0):
        raise ValueError(f"ttl must be positive, got {ttl}")
    return ttl


def iso(value: datetime | None) -> str | None:
    """The one ISO 8601 form of a time in messages, logs and JSON; None stays None."""
    return value.isoformat() if value is not None else None


@dataclass(frozen=True)
class Skip:
    """Why a contender did not get the lease: ``held`` (another holder's lease is in force), ``tick_claimed``
    (this tick already succeeded, or a later one was claimed), ``tick_ahead`` (more than ``horizon`` ahead
    of ``db_now``, the database clock: nothing stored), ``paused`` (by an operator: stronger than force)."""

    job: str
    tick: datetime | None
    reason: Literal["held", "tick_claimed", "tick_ahead", "paused"]
    holder: str
    locked_until: datetime | None
    claimed_tick: datetime | None
    db_now: datetime | None = None
    horizon: timedelta | None = None
    paused_by: str = ""
    paused_at: datetime | None = None
    paused_note: str = ""

    def __str__(self) -> str:
        if self.reason == "paused":
            return f"paused by {self.paused_by} since {iso(self.paused_at)}{': ' if self.paused_note else ''}{self.paused_note}"
        if self.reason == "held":
            return f"held by {self.holder} until {iso(self.locked_until)}"
        if self.reason == "tick_ahead":
            return (
                f"tick {iso(self.tick)} is more than {self.horizon} ahead of the database clock "
                f"({iso(self.db_now)})"
            )
        if self.claimed_tick == self.tick:
            return f"tick {iso(self.tick)} already done by {self.holder}"
        return f"a later tick {iso(self.claimed_tick)} was already claimed by {self.holder}"


@dataclass
class Lease:
    """A lease this process holds. ``token`` is the fencing number.

    ``writing`` is set while this process is inside ``fenced(lease)``;
    ``committed`` becomes true when such a block committed (docs/architecture.md,
    "The rules": 6, fencing). ``prior_commit`` is the token whose fenced write had committed
    last when this lease was won: a holder that died after its commit is known by it.
    """

    job: str
    holder: str
    token: int
    tick: datetime | None
    ttl: timedelta
    acquired_at: datetime
    lost_reason: str = ""
    committed: bool = False
    prior_commit: int | None = None
    writing: threading.Event = field(default_factory=threading.Event, repr=False)
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


def acquire(
    *,
    job: str,
    tick: datetime | None,
    ttl: timedelta,
    holder: str | None = None,
    horizon: timedelta | None = None,
) -> Lease | Skip:
    """Take the lease on ``job`` for ``tick`` (None: any tick, a forced run), or learn why not.

    One compare-and-set on the database clock: the job not paused, the lease free and, for a
    scheduled run, the stored tick empty, earlier, or this one not done (a retry), and the tick
    at most ``horizon`` ahead (None: no bound). The winner reads its token back in the same
    transaction (docs/architecture.md, "The rules": 1 and 3).
    """
    validate_ttl(ttl)
    holder = holder or make_holder()
    db = router.db_for_write(SyncLock)
    rows = SyncLock.objects.using(db).for_job(job)
    claim = rows.free().filter(paused_at__isnull=True)  # a pause binds every path at once
    values = {
        "holder": holder,
        "token": F("token") + 1,
        "acquired_at": Now(),
        "locked_until": now_plus(ttl),
        "heartbeat_at": Now(),
        "last_started_at": Now(),
        "last_status": RunStatus.RUNNING,
        "last_error": "",
    }
    if tick is not None:
        values.update(tick=tick, tick_done=False)
        claim = claim.filter(Q(tick__isnull=True) | Q(tick__lt=tick) | Q(tick=tick, tick_done=False))
        if horizon is not None:
            # tick <= now + horizon, with the database's now.
            claim = claim.filter(GreaterThanOrEqual(Now(), Value(tick - horizon)))
    for _attempt in range(3):
        # No savepoint: nothing here catches an error, so a caller's transaction
        # (if any) is simply joined.
        with transaction.atomic(using=db, savepoint=False):
            won = None
            if claim.update(**values):
                won = (
                    rows.filter(holder=holder).values_list("token", "acquired_at", "committed_token").first()
                )
        if won is not None:
            token, acquired_at, prior_commit = won
            _warn_on_skew(job=job, db_now=acquired_at)
            return Lease(job, holder, token, tick, ttl, acquired_at, prior_commit=prior_commit)
        state = (
            rows.annotate(db_now=Now())
            .values("holder", "locked_until", "tick", "tick_done", "db_now", *PAUSE_FIELDS)
            .first()
        )
        if state is None:
            if tick is not None and horizon is not None:
                # Refuse before the job's first row is even inserted: nothing stored.
                db_now = database_now()
                if tick > db_now + horizon:
                    return _ahead(job, tick, horizon, db_now)
            _create(job=job)
            continue  # the row exists now: compete on it
        db_now = state["db_now"]
        if tick is not None and horizon is not None and tick > db_now + horizon:
            # No skew warning: the run's own WARNING names the host's offset.
            return _ahead(job, tick, horizon, db_now)
        _warn_on_skew(job=job, db_now=db_now)
        skip = partial(Skip, job, tick, locked_until=state["locked_until"], claimed_tick=state["tick"])
        if state["paused_at"] is not None:  # stronger than --force, and than a held lease
            return skip(reason="paused", holder=state["holder"], **{f: state[f] for f in PAUSE_FIELDS})
        if state["locked_until"] is not None and state["locked_until"] >= db_now:
            return skip(reason="held", holder=state["holder"])
        stored = state["tick"]
        if None not in (tick, stored) and (stored > tick or (stored == tick and state["tick_done"])):
            claimant = state["holder"] or _tick_claimant(job=job, tick=stored, done=stored == tick)
            return skip(reason="tick_claimed", holder=claimant)
        # The holder released between our UPDATE and our read: try again.
    if state is None:
        raise LockError(f"the lock row for {job!r} keeps disappearing; is something deleting it?")
    return Skip(job, tick, "held", state["holder"], state["locked_until"], state["tick"])


def _ahead(job: str, tick: datetime, horizon: timedelta, db_now: datetime) -> Skip:
    return Skip(job, tick, "tick_ahead", "", None, None, db_now=db_now, horizon=horizon)


def _tick_claimant(*, job: str, tick: datetime, done: bool) -> str:
    """Who ran ``tick`` (who succeeded, when it is done), once its lease is
    released (released rows keep no holder)."""
    runs = JobRun.objects.for_job(job).filter(tick=tick)
    if done:
        runs = runs.succeeded()
    holder = runs.order_by("-started_at").values_list("holder", flat=True).first()
    return holder or "an earlier run"


def _create(*, job: str) -> None:
    """First use of a job: insert its row, free, for the compare-and-set to claim. A unique-key
    clash means another contender inserted it first, which serves as well. Plain values
    only: MongoDB cannot insert expressions such as ``Now()``."""
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
    limit = settings.LOCKS_MAX_CLOCK_SKEW
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
    """Extend ``lease`` by its TTL from the database's now, or raise ``LockLost``. Matches on
    the fencing token and a lease still in force: one taken over or force-released (both bump
    the token), released, or expired (even if nobody took it over yet) cannot be extended."""
    _renew(lease, values={})


def _renew(lease: Lease, *, values: dict) -> None:
    updated = (
        SyncLock.objects.for_job(lease.job)
        .filter(token=lease.token)
        .held()
        .update(locked_until=now_plus(lease.ttl), heartbeat_at=Now(), **values)
    )
    if not updated:
        reason = f"lease on {lease.job} (token {lease.token}) was taken over, released or expired"
        lease.mark_lost(reason)
        raise LockLost(reason)


@contextmanager
def fenced(lease: Lease) -> Iterator[None]:
    """The write phase of a run: one durable ``transaction.atomic()`` block whose first
    UPDATE renews ``lease`` (``LockLost`` before any write if it is gone), records its
    token as ``committed_token`` and marks a scheduled tick done, so both are true exactly
    when the writes commit; then ``lease.committed`` is true. An error on the COMMIT
    itself is resolved by ``read_back_commit`` (``CommitUnknown`` when it cannot tell).
    While inside, ``lease.writing`` is set: on SQLite a ``database is locked`` error of
    the heartbeat is this process's own write lock. docs/architecture.md, "The rules"
    (6 and 10; MongoDB, where ``atomic()`` does nothing, too).
    """
    lease.check()
    values = {"committed_token": lease.token}
    if lease.tick is not None:
        values["tick_done"] = True
    lease.writing.set()
    body_done = False
    try:
        with transaction.atomic(using=router.db_for_write(SyncLock), durable=True):
            _renew(lease, values=values)
            yield
            body_done = True
    except Error as exc:
        if not body_done:
            raise  # the block failed and was rolled back: nothing was written
        committed = read_back_commit(lease)
        if committed is None:
            raise CommitUnknown(
                f"the COMMIT of the fenced write of {lease.job} (token {lease.token}) got no answer "
                f"({error_text(exc)}) and the lock row could not be read back"
            ) from exc
        logger.warning(
            "job=%s token=%s the COMMIT of its fenced write got no answer (%s); the lock row says it %s",
            lease.job,
            lease.token,
            error_text(exc),
            "committed" if committed else "did not commit",
        )
        if not committed:
            raise
    finally:
        lease.writing.clear()
    lease.committed = True


def read_back_commit(lease: Lease) -> bool | None:
    """Whether a fenced write of ``lease`` committed, read from its lock row on a new
    connection; None when that cannot be told. ``FOR UPDATE NOWAIT``: a transaction whose
    COMMIT answer was lost may still hold the row on the server; retried with a backoff
    for at most the lease's TTL (``READ_BACK_SECONDS`` at most).
    """
    using = router.db_for_write(SyncLock)
    deadline = time.monotonic() + min(lease.ttl.total_seconds(), READ_BACK_SECONDS)
    delay = 0.1
    while True:
        connections[using].close()  # the old connection is broken, or in an unknown state
        try:
            with transaction.atomic(using=using):
                committed = (
                    SyncLock.objects.using(using)
                    .select_for_update(nowait=True)
                    .for_job(lease.job)
                    .values_list("committed_token", flat=True)
                    .first()
                )
        except Error:  # unreachable, or the row still locked by that transaction
            if time.monotonic() + delay > deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 5.0)
            continue
        if committed == lease.token:
            return True
        if committed is None or committed < lease.token:
            return False
        return None  # a later lease committed since: the row no longer tells about this one


def release(*, lease: Lease, status: str, error: str = "") -> bool:
    """Give the lease back, recording the outcome. Only the holder's token matches.

    A released row keeps no holder (a holder always has an expiry); the run's holder
    stays on its JobRun. A scheduled run's tick becomes done when it succeeded. A failure
    never reopens the tick on SQL databases; on MongoDB, where the done mark of a failed
    block stays, one without a committed fenced write does (docs/architecture.md, "The rules": 10).
    """
    values = {}
    if lease.tick is not None and status == RunStatus.SUCCEEDED:
        values["tick_done"] = True
    elif (
        not lease.committed and not connections[router.db_for_write(SyncLock)].features.supports_transactions
    ):
        values["committed_token"] = None
        if lease.tick is not None:
            values["tick_done"] = False
    return bool(
        SyncLock.objects.for_job(lease.job)
        .filter(token=lease.token)
        .update(
            holder="",
            locked_until=None,
            last_finished_at=Now(),
            last_status=status,
            last_error=error[:2000],
            **values,
        )
    )
