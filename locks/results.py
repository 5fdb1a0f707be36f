"""What one run came to: ``RunResult``, returned by ``locks.runner``'s ``run_locked`` and
``run_job``, and its one log line (``describe``). Plain values: the scheduler, the trigger
and the commands read it without the database."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from locks.claims import Skip, iso

Outcome = Literal["succeeded", "failed", "lost_lock", "skipped"]


@dataclass
class RunResult:
    job: str
    tick: datetime | None
    holder: str
    outcome: Outcome
    token: int | None = None
    skip: Skip | None = None
    reason: str = ""
    stats: dict = field(default_factory=dict)
    error: str = ""
    traceback: str = ""  # an unexpected exception's, bounded (locks.text.traceback_text)
    duration: float = 0.0
    attempt: int | None = None  # its number among its tick's attempts, of attempts (rule 12)
    attempts: int | None = None
    # After a failed attempt: how long until the next may start; None: it was the last one.
    retry_after: timedelta | None = None
    unreachable: bool = False  # skipped: the database could not be reached (costs no attempt)
    behind: bool = False  # catch_up "all": it was for a slot older than the current one
    # What made the run fail or be skipped for an unreachable database, so callers
    # can tell causes apart (an HTTP trigger maps them to status codes).
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.outcome in {"succeeded", "skipped"}

    @property
    def next_due_now(self) -> bool:
        """Under catch_up "all", whether a slot behind the current one is settled (this run
        succeeded, or had the slot's last attempt; or another host settled it meanwhile): then
        the next slot is due at once."""
        if not self.behind:
            return False
        if self.outcome in {"failed", "lost_lock"}:
            return self.retry_after is None
        settled_elsewhere = self.skip is not None and self.skip.reason in {"attempts_used", "tick_claimed"}
        return self.outcome == "succeeded" or settled_elsewhere

    def describe(self) -> str:
        parts = [f"job={self.job}", f"tick={iso(self.tick) or 'forced'}", f"holder={self.holder}"]
        parts.append(f"outcome={self.outcome}")
        if self.token is not None:
            parts.append(f"token={self.token}")
        if self.attempt is not None:
            parts.append(f"attempt={self.attempt}" + (f"/{self.attempts}" if self.attempts else ""))
        parts.extend(f"{key}={value}" for key, value in self.stats.items())
        if self.reason:
            parts.append(f"reason={self.reason}")
        if self.error:
            parts.append(f"error={self.error}")
        parts.append(f"duration={self.duration:.2f}s")
        return " ".join(parts)
