"""What a contender gets from ``acquire`` (``locks.leases``): a ``Lease`` it holds, or a ``Skip``
that says in one line why not; ``LockLost``, when a lease it held is gone; ``iso``, the one
time format of their messages; ``make_holder``, a contender's name; ``validate_ttl``. Plain values, no database: every part of the lock reads them.
"""

from __future__ import annotations

import os
import secrets
import socket
import threading
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal


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


@dataclass(frozen=True)
class Skip:
    """Why a contender did not get the lease. ``held``: another holder's lease is in force, or
    (``locked``) the lock row is locked by a write in progress; ``tick_claimed``: this tick
    already succeeded, or a later tick was claimed; ``tick_ahead``: the tick lies more than
    ``horizon`` ahead of the database clock (``db_now``), nothing stored; ``attempts_used``:
    the tick had its ``attempts`` and none succeeded; ``retry_later``: its last attempt failed
    and the next may start at ``retry_at`` (database clock); ``paused``: by an operator
    (stronger than force).
    """

    job: str
    tick: datetime | None
    reason: Literal["held", "tick_claimed", "tick_ahead", "attempts_used", "retry_later", "paused"]
    holder: str
    locked_until: datetime | None
    claimed_tick: datetime | None
    db_now: datetime | None = None
    horizon: timedelta | None = None
    locked: bool = False
    attempts: int | None = None
    retry_at: datetime | None = None
    paused_by: str = ""
    paused_at: datetime | None = None
    paused_note: str = ""

    def __str__(self) -> str:
        if self.reason == "paused":
            note = f": {self.paused_note}" if self.paused_note else ""
            return f"paused by {self.paused_by} since {iso(self.paused_at)}{note}"
        if self.reason == "held" and self.locked:
            lease = f"lease until {iso(self.locked_until)}" if self.locked_until else "lease released"
            return f"the lock row is locked by a write in progress (last holder {self.holder or 'none'}, {lease})"
        if self.reason == "held":
            return f"held by {self.holder} until {iso(self.locked_until)}"
        if self.reason == "tick_ahead":
            return (
                f"tick {iso(self.tick)} is more than {self.horizon} ahead of the database clock "
                f"({iso(self.db_now)})"
            )
        if self.reason == "attempts_used":
            return f"tick {iso(self.tick)} had its {self.attempts} attempts and none succeeded"
        if self.reason == "retry_later":
            return (
                f"tick {iso(self.tick)} failed attempt {self.attempts}; the next may start at "
                f"{iso(self.retry_at)}"
            )
        if self.claimed_tick == self.tick:
            return f"tick {iso(self.tick)} already done by {self.holder}"
        return f"a later tick {iso(self.claimed_tick)} was already claimed by {self.holder}"

    @property
    def wait(self) -> timedelta | None:
        """How long until the lease or the tick may be taken, by the database clock: until a held
        lease ends, or until the next attempt may start. None: not by waiting."""
        if self.db_now is None:
            return None
        until = {"held": self.locked_until, "retry_later": self.retry_at}.get(self.reason)
        return max(until - self.db_now, timedelta(0)) if until is not None else None


@dataclass
class Lease:
    """A lease this process holds. ``token`` is the fencing number.

    ``writing`` is set while this process is inside ``fenced(lease)``;
    ``committed`` becomes true when such a block committed (docs/architecture.md,
    "The rules": 6, fencing). ``prior_commit`` is the token whose fenced write had committed
    last when this lease was won: a holder that died after its commit is known by it.
    ``attempt`` is this run's number among its tick's attempts, on every host; after attempt k
    fails, the next may start ``retry_delays[k - 1]`` later (rule 12).
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
    attempt: int | None = None
    retry_delays: tuple[timedelta, ...] | None = None
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

    @property
    def retry_delay(self) -> timedelta | None:
        """How long after this attempt fails the next may start; None: it was the last one
        (or the tick has no retry policy, or the run claims no tick)."""
        if self.tick is None or self.retry_delays is None or self.attempt is None:
            return None
        return self.retry_delays[self.attempt - 1] if self.attempt <= len(self.retry_delays) else None
