"""The lease on a job: acquire, renew, the fenced write phase, release and the read-back of an
unanswered COMMIT; with ``locks.operator`` the only writer of ``SyncLock`` rows, each write one
conditional UPDATE judged by the database's clock (docs/architecture.md, "The lock")."""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import reduce
from operator import or_
from typing import Literal, NamedTuple, TypeVar

from django.conf import settings
from django.db import Error, IntegrityError, connections, router, transaction
from django.db.models import Case, Exists, F, OuterRef, PositiveIntegerField, Q, Value, When
from django.db.models.functions import Coalesce, Now
from django.db.models.lookups import Exact, GreaterThanOrEqual
from django.utils import timezone

from locks.db import (
    bound_lock_wait,
    bound_transaction,
    error_text,
    history,
    lease_transaction,
    missing_table,
    row_locked,
    safe_text,
    sync_wait_cancelled,
    transaction_aborted,
    unlocked,
    update_returning,
    without_waiting,
    write_transaction,
)
from locks.models import PAUSE_FIELDS, JobPause, JobRun, Outcome, SyncLock, database_now, now_plus
from locks.registry import attempts_of


class LockLost(RuntimeError):
    """The lease was taken over or could not be renewed; stop before writing."""


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


class Pause(NamedTuple):
    """An operator's pause: who, since when (database clock), why."""

    by: str
    since: datetime | None
    note: str = ""

    def __str__(self) -> str:
        """ "paused by X since T: note", the one wording of a pause (skips, commands, log lines)."""
        return f"paused by {self.by} since {iso(self.since)}" + (f": {self.note}" if self.note else "")


# What each reason of a Skip says (docs/architecture.md, "The rules": 1).
SKIPS = {
    "held": "held by {0.holder} until {locked_until}",
    "tick_ahead": "tick {tick} is more than {0.horizon} ahead of the database clock ({db_now})",
    "attempts_used": "tick {tick} had its {0.attempts} attempts and none succeeded",
    "retry_later": "tick {tick} failed attempt {0.attempts}; the next may start at {retry_at}",
    "tick_done": "tick {tick} already done by {0.holder}",
    "tick_claimed": "a later tick {claimed_tick} was already claimed by {0.holder}",
}


@dataclass(frozen=True)
class Skip:
    """Why a contender did not get the lease: a ``reason`` and what it was judged on."""

    job: str
    tick: datetime | None
    reason: Literal["held", "tick_claimed", "tick_ahead", "attempts_used", "retry_later", "paused"]
    holder: str = ""
    locked_until: datetime | None = None
    claimed_tick: datetime | None = None
    db_now: datetime | None = None
    horizon: timedelta | None = None
    locked: bool = False
    attempts: int | None = None
    retry_at: datetime | None = None
    pause: Pause | None = None

    def __str__(self) -> str:
        if self.reason == "paused":
            return str(self.pause)
        if self.reason == "held" and self.locked:
            lease = f"lease until {iso(self.locked_until)}" if self.locked_until else "lease released"
            return f"the lock row is locked by a write in progress (last holder {self.holder or 'none'}, {lease})"
        done = self.reason == "tick_claimed" and self.claimed_tick == self.tick
        times = {
            n: iso(getattr(self, n)) for n in ("tick", "locked_until", "db_now", "claimed_tick", "retry_at")
        }
        return SKIPS["tick_done" if done else self.reason].format(self, **times)

    @property
    def later(self) -> bool:
        """A later tick than the one asked for was claimed: until an operator's reset gives this one back."""
        return self.reason == "tick_claimed" and self.claimed_tick != self.tick  # as __str__ says it

    @property
    def wait(self) -> timedelta | None:
        """How long until a held lease ends or the next attempt may start; None: not by waiting."""
        if self.db_now is None:
            return None
        until = {"held": self.locked_until, "retry_later": self.retry_at}.get(self.reason)
        return max(until - self.db_now, timedelta(0)) if until is not None else None


class Grant(NamedTuple):
    """What the claim that won a lease read from its lock row; a ``RunResult``'s is its lease's."""

    acquired_at: datetime | None = None  # by the database clock
    attempt: int | None = None  # this run's among its tick's
    attempts: int | None = None  # of how many its tick gets (None: no limit)
    retry_delay: timedelta | None = None  # after this attempt fails; None: it was the last one
    timeline: int | None = None  # with system_id, the database history it was granted in
    system_id: int | None = None
    failover: str = ""  # a failover its claim found
    failover_slot: str = ""  # that one, or an earlier one at or after its tick
    prior_commit: int | None = None  # the token whose fenced write had committed last
    unsettled: bool = True  # runs of earlier tokens to settle


@dataclass
class Lease:
    """A lease this process holds; ``token`` is the fencing number (docs/architecture.md, "The
    rules": 6, 12, 15, 16)."""

    job: str
    holder: str
    token: int
    tick: datetime | None
    ttl: timedelta
    grant: Grant = field(default_factory=Grant)  # what its claim read from its lock row
    lost_reason: str = ""
    committed: bool = False  # a fenced(lease) block committed
    unconfirmed: bool = False  # the fenced COMMIT was not confirmed by the synchronous standby
    interrupted_commit: bool = False  # a signal came during the fenced COMMIT
    writing: threading.Event = field(default_factory=threading.Event, repr=False)  # inside fenced(lease)
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

    @property
    def token_name(self) -> str:
        """ "T/N" (timeline/token) where there is a timeline, else the token."""
        return f"{self.grant.timeline}/{self.token}" if self.grant.timeline is not None else str(self.token)


T = TypeVar("T")
# The name the lock's log lines have always carried (operators filter on it).
logger = logging.getLogger("locks.api")


class LockError(Exception):
    """The lock cannot be used at all (for example, its table is missing)."""


class NotCommitted(RuntimeError):
    """A fenced write that is not in the database (rolled back, or lost in a failover)."""


class CommitUnknown(RuntimeError):
    """A fenced write's COMMIT got no answer and the lock row could not tell whether it committed."""


# How long a run whose COMMIT answer was lost keeps reading the lock row back (at most its TTL).
READ_BACK_SECONDS = 30
# How long release waits for a locked lock row, and the pauses of a contender that found the row
# free but could not take it (locked by a write in progress, or released meanwhile).
RELEASE_WAIT = 5.0
CONTENDER_PAUSES = (0.05, 0.1, 0.0)
# How long the first INSERT of a job's lock row may wait on a concurrent one; then it is locked.
CREATE_WAIT = 5.0
# The outcomes after which a tick may be tried again, once its retry delay has passed.
RETRIED = frozenset({Outcome.FAILED, Outcome.LOST_LOCK, Outcome.UNKNOWN})


class ClaimRules(NamedTuple):
    """How ``acquire`` claims: a tick at most ``horizon`` ahead, a forced run's slot, pause on failover."""

    horizon: timedelta | None = None
    retries: datetime | None = None
    pause_on_failover: bool = False


def acquire(
    job: str,
    tick: datetime | None,
    ttl: timedelta,
    *,
    holder: str | None = None,
    retry_delays: tuple[timedelta, ...] | None = None,
    rules: ClaimRules = ClaimRules(),
) -> Lease | Skip:
    """Take the lease on ``job`` for ``tick`` (None: a forced run; ``rules.retries``: see
    ``_retry_claimed``), or learn why not (docs/architecture.md, "The rules": 1, 3, 10, 11, 12)."""
    validate_ttl(ttl)
    holder, (horizon, retries, pause_on_failover) = holder or make_holder(), rules
    db = router.db_for_write(SyncLock)
    rows = SyncLock.objects.using(db).for_job(job)
    most = attempts_of(retry_delays)
    claim, values = _claim(rows, holder=holder, tick=tick, ttl=ttl, horizon=horizon, most=most)
    claim = unlocked(claim, using=db, skip=True)  # a row locked by a write in progress: no match
    state, history_of = None, {"job": job, "tick": tick, "using": db, "pause": pause_on_failover}
    for pause in CONTENDER_PAUSES:
        try:  # each statement commits by itself (in a caller's transaction it joins that one)
            mine = rows.filter(holder=holder)
            won = update_returning(claim, values, _won(mine, job=job, using=db))  # one statement
            won = won and _history_of_win(won, mine, **history_of)
        except Error as exc:  # no answer: the claim may have committed, read it back
            if missing_table(exc) or connections[db].in_atomic_block:
                raise
            if (won := read_back_claim(rows, holder=holder, ttl=ttl, **history_of)) is None:
                raise
        if won and tick is None and retries is not None:  # the row is this lease's while it holds it
            tick, won["tick_attempts"] = _retry_claimed(rows.filter(token=won["token"]), retries, most)
        if won:
            _warn_on_skew(job=job, db_now=won["acquired_at"])
            return _lease(won, job=job, holder=holder, tick=tick, ttl=ttl, delays=retry_delays)
        state = rows.annotate(db_now=Now()).values(*SEEN, *PAUSE_FIELDS).first()
        if state is None:
            if tick is not None and horizon is not None:  # refused before its row exists: nothing stored
                db_now = database_now()
                if tick > db_now + horizon:
                    return Skip(job, tick, "tick_ahead", db_now=db_now, horizon=horizon)
            if not create_lock_row(job=job):
                return Skip(job, tick, "held", locked=True)
            continue  # the row exists now: compete on it
        if (skip := _why_not(job, tick, state, horizon=horizon, most=most)) is not None:
            return skip
        time.sleep(pause)  # it looked free: locked by a write in progress, or released meanwhile
    if state is None:
        raise LockError(f"the lock row for {job!r} keeps disappearing; is something deleting it?")
    return _skip(job, tick, state, "held", locked=True)


# What the winner reads back, and what a contender that lost reads to say why.
WON = ("token", "acquired_at", "committed_token", "tick_attempts", "timeline", "system_id")
WON_FAILOVER = ("failover_note", "failover_through")
SEEN = ("holder", "locked_until", "tick", "tick_done", "tick_attempts", "retry_at", "db_now")


def _lease(won: dict, *, job: str, holder: str, tick: datetime | None, ttl: timedelta, delays) -> Lease:
    attempt = won["tick_attempts"] if tick is not None else None
    retry_delay = delays[attempt - 1] if attempt and delays and attempt <= len(delays) else None
    history = won.get("now_timeline"), won.get("now_system_id"), won["failover"], won["failover_slot"]
    earlier = won["committed_token"], won["unsettled"]
    grant = Grant(won["acquired_at"], attempt, attempts_of(delays), retry_delay, *history, *earlier)
    return Lease(job, holder, won["token"], tick, ttl, grant)


def _won(mine, *, job: str, using: str):
    """The read of a won row (``mine``): its lease, the server's history now, and whether a run of
    an earlier token is unsettled."""
    now = history(using=using)
    prior = Coalesce(OuterRef("committed_token"), 0)
    unsettled = Exists(JobRun.objects.for_job(job).unsettled(before=OuterRef("token"), committed=prior))
    return mine.annotate(**{f"now_{key}": value for key, value in now.items()}, unsettled=unsettled).values(
        *WON, *(WON_FAILOVER if now else ()), *(f"now_{k}" for k in now), "unsettled"
    )


def _history_of_win(won: dict, mine, *, job: str, tick: datetime | None, using: str, pause: bool) -> dict:
    """``won`` (``_won``'s read of ``mine``), the row stamped with the server's history: one stamped
    in another is a failover since its last lease, named in ``failover`` and paused with ``pause``."""
    won["failover"] = won["failover_slot"] = ""
    if "now_timeline" not in won:
        return won
    if (won["timeline"], won["system_id"]) == (won["now_timeline"], won["now_system_id"]):
        # A later slot than the failover's moment ran only here; one at or before it may have run
        # on the old primary too (several lost with a frozen link): each such run is named.
        through = won["failover_through"]
        if tick is not None and through is not None and tick <= through:
            won["failover_slot"] = won["failover_note"]
            logger.warning(
                "job=%s token=%s/%s tick %s is at or before the failover: %s",
                *(job, won["now_timeline"], won["token"], iso(tick), won["failover_note"]),
            )
        return won
    stamp = {"timeline": won["now_timeline"], "system_id": won["now_system_id"]}
    if won["timeline"] is not None:
        won["failover"] = won["failover_slot"] = (
            f"the database failed over since token {won['token'] - 1} was granted on timeline "
            f"{won['timeline']} (now timeline {won['now_timeline']}"
            + (", another cluster" if won["system_id"] != won["now_system_id"] else "")
            + "): a run of that history may be lost, or may have done its work there too"
        )
        logger.warning("job=%s token=%s/%s %s", job, won["now_timeline"], won["token"], won["failover"])
        stamp.update(failover_note=won["failover"], failover_through=Now())
    # on_failover "pause": in this transaction, so no later run can miss the failover; an operator's
    # pause since the claim stands. Its history as pause_job writes it.
    with lease_transaction(using=using):
        mine.update(**stamp)
        note = pause and won["failover"] and failover_pause_note(won["failover"])
        if note and mine.filter(paused_at__isnull=True).update(
            paused_at=Now(), paused_by=FAILOVER_PAUSER, paused_note=note
        ):
            paused_at = mine.values_list("paused_at", flat=True).get()
            JobPause.objects.using(using).create(
                job_name=job, paused_at=paused_at, paused_by=FAILOVER_PAUSER, note=note
            )
    return won


# Who pauses a job on a failover (``on_failover`` "pause"), as a pause names who acted.
FAILOVER_PAUSER = "locks:failover"
NOTE_LIMIT = 500  # characters of a pause note kept: it is repeated on every skip line


def failover_pause_note(failover: str) -> str:
    return safe_text(" ".join(f"paused on a database failover: {failover}".split()), limit=NOTE_LIMIT)


def _claim(rows, *, holder: str, tick, ttl: timedelta, horizon, most) -> tuple:
    """Acquire's compare-and-set: the filter a row must pass and the values it then gets."""
    claim = rows.free().filter(paused_at__isnull=True)  # a pause binds every path at once
    values = {
        "holder": holder,
        "token": F("token") + 1,
        "acquired_at": Now(),
        "locked_until": now_plus(ttl),
        "heartbeat_at": Now(),
        "last_started_at": Now(),
        "last_status": Outcome.RUNNING,
        "last_error": "",
    }
    if tick is None:
        return claim, values
    again = Q(tick=tick, tick_done=False) & (Q(retry_at__isnull=True) | Q(retry_at__lte=Now()))
    if most is not None:
        again &= Q(tick_attempts__lt=most)
    claim = claim.filter(Q(tick__isnull=True) | Q(tick__lt=tick) | again)
    attempts = Case(When(tick=tick, then=F("tick_attempts") + 1), default=Value(1))
    values.update(tick=tick, tick_done=False, tick_attempts=attempts, retry_at=None)
    if horizon is not None:  # tick <= now + horizon, with the database's now
        claim = claim.filter(GreaterThanOrEqual(Now(), Value(tick - horizon)))
    return claim, values


def _retry_claimed(mine, tick: datetime, most: int | None) -> tuple[datetime | None, int | None]:
    """A forced lease (``mine``) is the next attempt of ``tick``, the slot of now, if that is claimed,
    not done and has attempts left, whatever its retry delay (rule 3): that tick and attempt, or Nones."""
    still_open = Q(tick=tick, tick_done=False) & (Q() if most is None else Q(tick_attempts__lt=most))
    if not mine.filter(still_open).update(tick_attempts=F("tick_attempts") + 1, retry_at=None):
        return None, None
    return tick, mine.values_list("tick_attempts", flat=True).first()


def _why_not(job: str, tick: datetime | None, state: dict, *, horizon, most) -> Skip | None:
    """Why the lock row ``state``, read after a claim that did not match, refuses ``tick``; None: nothing."""
    db_now = state["db_now"]
    if tick is not None and horizon is not None and tick > db_now + horizon:
        # No skew warning: the run's own names the offset.
        return Skip(job, tick, "tick_ahead", db_now=db_now, horizon=horizon)
    _warn_on_skew(job=job, db_now=db_now)
    if state["paused_at"] is not None:  # stronger than --force, and than a held lease
        return _skip(job, tick, state, "paused", pause=Pause(*(state[f] for f in PAUSE_FIELDS)))
    if state["locked_until"] is not None and state["locked_until"] >= db_now:
        return _skip(job, tick, state, "held")
    stored = state["tick"]
    if None in (tick, stored) or stored < tick:
        return None
    if stored > tick or state["tick_done"]:
        # A released row keeps no holder: the tick's latest run, whatever its status (it releases first).
        runs = JobRun.objects.for_job(job).filter(tick=stored).order_by("-started_at")
        claimant = state["holder"] or runs.values_list("holder", flat=True).first() or "an earlier run"
        return _skip(job, tick, state, "tick_claimed", holder=claimant)
    if most is not None and state["tick_attempts"] >= most:
        return _skip(job, tick, state, "attempts_used")
    if state["retry_at"] is not None and state["retry_at"] > db_now:
        return _skip(job, tick, state, "retry_later")
    return None


def _skip(job: str, tick: datetime | None, state: dict, reason: str, **why) -> Skip:
    """A ``Skip`` for ``reason``, judged on the lock row ``state`` (its holder unless ``why`` names one)."""
    why.setdefault("holder", state["holder"])
    row = {"locked_until": state["locked_until"], "claimed_tick": state["tick"], "db_now": state["db_now"]}
    return Skip(job, tick, reason, **row, attempts=state["tick_attempts"], retry_at=state["retry_at"], **why)


def create_lock_row(*, job: str) -> bool:
    """Insert ``job``'s lock row, free, created at the database's now read first (docs/mongodb.md); False
    when another contender's INSERT of it has not committed within ``CREATE_WAIT``."""
    using = router.db_for_write(SyncLock)
    table = SyncLock._meta.db_table
    if table not in connections[using].introspection.table_names():  # MongoDB would create it unindexed
        raise LockError(f"the lock table {table} is missing: run `python manage.py migrate`")
    try:
        with lease_transaction(using=using):
            bound_lock_wait(using=using, seconds=CREATE_WAIT)  # behind another contender's INSERT
            SyncLock.objects.create(job_name=job, created_at=database_now())  # check_jobs judges from it
    except IntegrityError:
        pass
    except Error as exc:
        if not row_locked(exc):
            raise
        return False
    return True


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
            *(job, skew, limit, socket.gethostname()),
        )


def renew(*, lease: Lease) -> None:
    """Extend ``lease`` by its TTL from the database's now if its token still holds it, else
    ``LockLost``; a lock row locked by a write in progress is not waited for (``RowLocked``)."""
    using = router.db_for_write(SyncLock)
    rows = unlocked(SyncLock.objects.using(using).for_job(lease.job), using=using, skip=False)
    what = f"renewing the lease on {lease.job}"
    without_waiting(lambda: _renew(lease, rows=rows, values={}), using=using, within=0, what=what)


def _renew(lease: Lease, *, rows, values: dict) -> None:
    """The renewal, in the history the lease was granted in (rule 16)."""
    using = rows.db
    same = history(using=using) if lease.grant.timeline is not None else {}
    if same:
        rows = rows.filter(Exact(same["timeline"], Value(lease.grant.timeline)))
    renewed = {"locked_until": now_plus(lease.ttl), "heartbeat_at": Now(), **values}
    if not rows.filter(token=lease.token).held().update(**renewed):
        rows = SyncLock.objects.using(using).for_job(lease.job)
        now = rows.annotate(now=same["timeline"]).values_list("now", flat=True).first() if same else None
        reason = _lost_reason(Held(lease.job, lease.token, lease.ttl, lease.grant.timeline), now_timeline=now)
        lease.mark_lost(reason)
        raise LockLost(reason)


def _lost_reason(lease: Held, *, now_timeline: int | None) -> str:
    """Why ``lease`` could not be renewed: gone, or granted in another history than ``now_timeline``."""
    if None in (now_timeline, lease.timeline) or now_timeline == lease.timeline:
        return f"lease on {lease.job} (token {lease.token}) was taken over, released or expired"
    return (
        f"lease on {lease.job} (token {lease.timeline}/{lease.token}) belongs to another database history: "
        f"the database failed over since token {lease.token} was granted on timeline {lease.timeline} "
        f"(now timeline {now_timeline})"
    )


class Held(NamedTuple):
    """A lease that a scheduler's worker holds and its scheduler renews (``renew_all``)."""

    job: str
    token: int
    ttl: timedelta
    timeline: int | None = None


def renew_all(leases: list[Held]) -> dict[Held, str]:
    """Renew ``leases`` in one statement, which skips a row locked by a write in progress; the ones lost,
    with why, read in a second only when one was not (docs/architecture.md, "The rules": 5)."""
    using = router.db_for_write(SyncLock)
    same = history(using=using)
    mine, until = [], []
    for held in leases:
        granted = Q(job_name=held.job, token=held.token)
        if same and held.timeline is not None:
            granted &= Q(Exact(same["timeline"], Value(held.timeline)))
        mine.append(granted)
        until.append(When(job_name=held.job, then=now_plus(held.ttl)))
    rows = unlocked(SyncLock.objects.using(using).filter(reduce(or_, mine)).held(), using=using, skip=True)
    if rows.update(locked_until=Case(*until), heartbeat_at=Now()) == len(leases):
        return {}
    now = {"db_now": Now(), **({"now_timeline": same["timeline"]} if same else {})}
    read = SyncLock.objects.using(using).filter(job_name__in=[held.job for held in leases]).annotate(**now)
    rows = {row["job_name"]: row for row in read.values("job_name", "token", "locked_until", *now)}
    lost = {}
    for held in leases:
        row = rows.get(held.job, {})
        timeline = row.get("now_timeline")
        in_force = row.get("locked_until") is not None and row["locked_until"] >= row["db_now"]
        moved = None not in (held.timeline, timeline) and held.timeline != timeline
        if row.get("token") == held.token and in_force and not moved:
            continue  # locked by a write in progress (which renewed it): renewed at the next beat
        lost[held] = _lost_reason(held, now_timeline=timeline)
    return lost


@contextmanager
def fenced(lease: Lease, *, settle: bool = True) -> Iterator[None]:
    """The write phase of a run: one durable ``transaction.atomic()`` block whose first UPDATE renews
    ``lease``, records its token as ``committed_token`` and marks its tick done (``settle=False``:
    renews only). docs/architecture.md, "The rules": 6, 10, 15."""
    lease.check()
    values = {"committed_token": lease.token} if settle else {}
    if lease.tick is not None and settle:
        values.update(tick=lease.tick, tick_done=True)
    lease.writing.set()
    body_done = rolled_back = aborted = False
    using = router.db_for_write(SyncLock)
    try:
        with write_transaction(using=using, durable=True):
            bound_transaction(using=using, seconds=lease.ttl.total_seconds())
            sync_wait_cancelled(using=using, forget=True)
            _renew(lease, rows=SyncLock.objects.using(using).for_job(lease.job), values=values)
            yield
            body_done, rolled_back = True, transaction.get_rollback(using=using)
            aborted = not rolled_back and transaction_aborted(using=using)  # a failed statement, caught
            if aborted:  # roll back, not a COMMIT the server would answer with a silent ROLLBACK
                transaction.set_rollback(True, using=using)
        _unconfirmed(lease, using=using)
    except Error as exc:
        if not body_done:
            raise  # the block failed and was rolled back: nothing was written
        if not settle:  # the row does not tell; the next attempt reads what it wrote (locks.tasks)
            raise CommitUnknown(
                f"the COMMIT of {lease.job} (token {lease.token}): {error_text(exc)}"
            ) from exc
        _unconfirmed(lease, using=using, cause=exc)
        committed = read_back_commit(lease)
        if committed is None:
            raise CommitUnknown(
                f"the COMMIT of the fenced write of {lease.job} (token {lease.token}) got no answer "
                f"({error_text(exc)}) and the lock row could not be read back"
            ) from exc
        logger.warning(
            "job=%s token=%s the COMMIT of its fenced write got no answer (%s); the lock row says it %s",
            *(lease.job, lease.token, error_text(exc), "committed" if committed else "did not commit"),
        )
        if not committed:
            raise
    except BaseException:
        lease.interrupted_commit = body_done  # a signal during its COMMIT: read back (runner._settle)
        raise
    finally:
        lease.writing.clear()
    if rolled_back or aborted:
        why = ": a statement in it failed and the database aborted its transaction" if aborted else ""
        why += " (the error was caught inside the block)" if aborted else ""
        raise NotCommitted(f"the fenced block of {lease.job} (token {lease.token}) was rolled back{why}")
    lease.committed = lease.committed or settle  # a later block that does not settle keeps an earlier commit


def _unconfirmed(lease: Lease, *, using: str, cause: BaseException | None = None) -> None:
    """``CommitUnknown`` when the server said the fenced COMMIT did not wait for its synchronous
    standby: committed here, perhaps not on the standby a failover promotes (rule 15)."""
    if not (said := sync_wait_cancelled(using=using)):
        return
    lease.unconfirmed = True
    logger.warning("job=%s token=%s the COMMIT of its fenced write: %s", lease.job, lease.token_name, said)
    raise CommitUnknown(
        f"the fenced write of {lease.job} (token {lease.token_name}) committed on this server without its "
        f"synchronous standby's confirmation ({said})"
    ) from cause


def read_back_commit(lease: Lease) -> bool | None:
    """Whether a fenced write of ``lease`` committed, read from its lock row; None when the row cannot
    tell (unreadable, a later lease committed since, or claimed since in another history: rule 16)."""
    using = router.db_for_write(SyncLock)

    def read() -> dict:  # the lock row ({}: none)
        with lease_transaction(using=using):
            rows = unlocked(SyncLock.objects.using(using).for_job(lease.job), using=using, skip=False)
            return rows.annotate(db_now=Now()).values().first() or {}

    row = _read_back(read, using=using, seconds=lease.ttl.total_seconds())
    granted_in = (lease.grant.timeline, lease.grant.system_id)
    if not row or (row["timeline"], row["system_id"]) != granted_in:  # {}: the row is gone
        return None
    if (committed := row["committed_token"]) is not None and committed > lease.token:
        return None  # a later lease committed since: the row no longer tells about this one
    return committed == lease.token


def read_back_claim(rows, *, holder: str, ttl: timedelta, **history_of) -> dict | None:
    """What ``_history_of_win`` reads if acquire's claim committed though its answer was lost, else None."""

    def read() -> dict | None:
        mine = unlocked(rows, using=rows.db, skip=False).filter(holder=holder).held()
        won = _won(mine, job=history_of["job"], using=rows.db).first()
        return won and _history_of_win(won, mine, **history_of)

    return _read_back(read, using=rows.db, seconds=ttl.total_seconds())


def _read_back(read: Callable[[], T], *, using: str, seconds: float) -> T | None:
    """``read()`` on a new connection, tried again while it raises for at most ``seconds`` and
    ``READ_BACK_SECONDS``; None if it never answered."""
    deadline = time.monotonic() + min(seconds, READ_BACK_SECONDS)
    delay = 0.1
    while True:
        connections[using].close()
        try:
            return read()
        except Error:
            if time.monotonic() + delay > deadline:
                return None
            time.sleep(delay)
            delay = min(delay * 2, 5.0)


def release(*, lease: Lease, status: str, error: str = "", used: bool = True) -> bool:
    """Give the lease back with the outcome (``used=False``: its attempt too); False when no longer this
    lease's; ``NotCommitted``: a success whose fenced write the row does not show (rules 10, 12, 15, 16)."""
    using = router.db_for_write(SyncLock)
    values = {}
    if not used and lease.tick is not None:
        # Once, to its own tick: not again in a repeat (its answer lost), nor to a tick reset meanwhile.
        once = When(locked_until__isnull=False, tick=lease.tick, then=F("tick_attempts") - 1)
        values["tick_attempts"] = Case(once, default=F("tick_attempts"), output_field=PositiveIntegerField())
    elif status in RETRIED and lease.grant.retry_delay is not None:
        values["retry_at"] = now_plus(lease.grant.retry_delay)
    if lease.tick is not None and status == Outcome.SUCCEEDED:
        values.update(tick=lease.tick, tick_done=True)
    elif not lease.committed and not connections[using].features.supports_transactions:
        values["committed_token"] = None
        if lease.tick is not None:
            values["tick_done"] = False
    rows = _granted(lease, using=using)
    if status == Outcome.SUCCEEDED and lease.committed:
        rows = rows.filter(committed_token=lease.token)
    update = dict(
        holder="", locked_until=None, last_finished_at=Now(), last_status=status, last_error=error[:2000]
    )

    def write(rows, update: dict) -> int:
        rows = unlocked(rows, using=using, skip=False)
        what = f"releasing the lease on {lease.job} (token {lease.token})"
        return without_waiting(lambda: rows.update(**update), using=using, within=RELEASE_WAIT, what=what)

    if write(rows, {**update, **values}):
        return True
    if status != Outcome.SUCCEEDED or not lease.committed:
        return False
    missing = f"its fenced write (token {lease.token}) is not in this database's history"
    failed = {**update, "last_status": Outcome.FAILED, "last_error": missing}
    if lease.grant.retry_delay is not None:
        failed["retry_at"] = now_plus(lease.grant.retry_delay)
    if not write(_granted(lease, using=using), failed):
        return False
    raise NotCommitted(missing)


def _granted(lease: Lease, *, using: str):
    """The lock row while it is ``lease``'s: its token, in the history it was granted in."""
    rows = SyncLock.objects.using(using).for_job(lease.job).filter(token=lease.token)
    if lease.grant.timeline is not None:
        rows = rows.filter(timeline=lease.grant.timeline, system_id=lease.grant.system_id)
    return rows
