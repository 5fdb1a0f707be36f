"""A run of a job under its lease: ``run_job`` (a registered job, the one way every caller runs one), ``run_locked`` (any function), the heartbeat, the ``JobRun`` record, and ``RunResult``: what a run came to, its one log line, its exit code and HTTP status (docs/architecture.md, "The lock")."""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Literal

from django.conf import settings
from django.db import Error, OperationalError, ProgrammingError, connections, router
from django.db.models import TextField, Value
from django.db.models.functions import Concat, Now
from django.utils import timezone

from locks import schedule
from locks.db import RowLocked, error_text, safe_text, traceback_text
from locks.lease import (
    CommitUnknown,
    Lease,
    LockError,
    LockLost,
    Skip,
    acquire,
    iso,
    make_holder,
    read_back_commit,
    release,
    renew,
    validate_ttl,
)
from locks.models import JobRun, Outcome, SyncLock, now_plus
from locks.registry import ALL, Job, get_job, tick_window
from locks.schedule import InvalidTick

# --- from results.py ---

RunOutcome = Literal["succeeded", "failed", "lost_lock", "skipped"]  # not models.Outcome: it shadowed it


@dataclass
class RunResult:
    job: str
    tick: datetime | None
    holder: str
    outcome: RunOutcome
    token: int | None = None
    skip: Skip | None = None
    reason: str = ""
    stats: dict = field(default_factory=dict)
    error: str = ""
    traceback: str = ""  # an unexpected exception's, bounded (locks.db.traceback_text)
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


# --- from runner.py ---

# The name the lock's log lines have always carried (operators filter on it).
logger = logging.getLogger("locks.api")

# Characters of an expected error's message kept (SyncLock.last_error keeps as many).
ERROR_LIMIT = 2000
# The most runs one run_due makes to catch up slots behind (a day of minutes, and then some).
MAX_CATCH_UP = 2000


class _Heartbeat(threading.Thread):
    """Renews the lease every TTL/3 until the run ends, it fails, or the run has
    lasted longer than ``max_run_time``; then the lease is marked lost, so the
    job's next ``lease.check()`` or ``fenced()`` raises ``LockLost``."""

    def __init__(self, lease: Lease, *, max_run_time: timedelta | None, started: float) -> None:
        super().__init__(name=f"heartbeat-{lease.job}", daemon=True)
        self.lease = lease
        self.interval = lease.ttl.total_seconds() / 3
        self.max_run_time = max_run_time
        self.deadline = started + max_run_time.total_seconds() if max_run_time is not None else None
        self.stopping = threading.Event()
        # While this process is inside fenced(lease), its transaction renewed the lease as it
        # began and holds the lock row (PostgreSQL) or the one write lock (SQLite) until it
        # ends: nobody can take the lease meanwhile, so the beat leaves it alone.
        self.fenced_holds_row = connections[router.db_for_write(SyncLock)].features.supports_transactions

    def run(self) -> None:
        try:
            while not self.stopping.wait(self.interval):
                if self.deadline is not None and time.monotonic() > self.deadline:
                    # Stop renewing: the lease runs out within a TTL and others may take it.
                    self.lease.mark_lost(f"ran longer than its maximum run time {self.max_run_time}")
                    logger.warning("job=%s heartbeat: %s", self.lease.job, self.lease.lost_reason)
                    return
                if self.lease.writing.is_set() and self.fenced_holds_row:
                    logger.debug(
                        "job=%s heartbeat: its fenced write holds the lock row; not renewing", self.lease.job
                    )
                    continue
                try:
                    renew(lease=self.lease)
                except LockLost:
                    logger.warning("job=%s heartbeat: %s", self.lease.job, self.lease.lost_reason)
                    return
                except RowLocked as exc:  # an operator's write, a contender's: for a moment
                    logger.debug("job=%s heartbeat: %s; trying again at the next beat", self.lease.job, exc)
                    continue
                except Error as exc:
                    if isinstance(exc, OperationalError) and self.lease.writing.is_set():
                        # SQLite: this process's own write transaction (fenced, which
                        # renewed the lease as it began) holds the database's one write
                        # lock, so no other process can take the lease meanwhile.
                        logger.debug(
                            "job=%s heartbeat: %s while this process writes; trying again at the next beat",
                            self.lease.job,
                            error_text(exc),
                        )
                        continue
                    self.lease.mark_lost(f"heartbeat could not renew the lease: {error_text(exc)}")
                    logger.warning("job=%s heartbeat: %s", self.lease.job, self.lease.lost_reason)
                    return
        finally:
            connections.close_all()

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=self.interval + 5)


def run_locked(
    *,
    job: str,
    tick: datetime | None,
    ttl: timedelta,
    fn: Callable[[Lease], Mapping | None],
    holder: str | None = None,
    expected_errors: tuple[type[BaseException], ...] = (),
    horizon: timedelta | None = None,
    max_run_time: timedelta | None = None,
    retry_delays: tuple[timedelta, ...] | None = None,
    requested_by: str = "",
) -> RunResult:
    """Run ``fn(lease)`` if this process wins the lease for ``tick``. Never raises for the lock's
    sake: an unreachable database, a lease held elsewhere, a pause or a tick more than ``horizon``
    ahead of the database clock is a skip; a failure in ``fn`` is recorded on a ``JobRun`` and
    returned. A heartbeat renews the lease every TTL/3, for at most ``max_run_time``; ``fn`` calls
    ``lease.check()`` before writing, or writes inside ``fenced(lease)``; a run whose fenced block
    committed is a success. ``expected_errors`` and database errors are logged without a
    traceback; anything else keeps it, on its ``JobRun`` too. ``retry_delays``: a tick gets
    ``1 + len`` attempts across every host, each not before its delay after the previous failed
    (None: no limit). ``requested_by`` (``cron``, ``admin:alice``, …) goes on the ``JobRun``."""
    validate_ttl(ttl)
    if max_run_time is not None and max_run_time <= timedelta(0):
        raise ValueError(f"max_run_time must be positive, got {max_run_time}")
    holder = holder or make_holder()
    started = time.monotonic()
    result = RunResult(job=job, tick=tick, holder=holder, outcome="skipped")
    try:
        connections[router.db_for_write(SyncLock)].ensure_connection()
        got = acquire(job=job, tick=tick, ttl=ttl, holder=holder, horizon=horizon, retry_delays=retry_delays)
    except Error as exc:
        return _unreachable(result, exc, started)

    if isinstance(got, Skip):
        result.skip, result.reason = got, str(got)
        result.duration = time.monotonic() - started
        if got.reason == "tick_ahead":
            # Nothing was stored; most likely this host's clock (or a --tick) is wrong.
            offset = (timezone.now() - got.db_now).total_seconds()
            result.reason += f"; this host's clock is {offset:+.0f} s off the database clock"
            logger.warning("%s", result.describe())
        else:
            logger.info("%s", result.describe())
        return result

    lease = got
    result.token, result.attempt = lease.token, lease.attempt
    result.attempts = (
        1 + len(retry_delays) if lease.attempt is not None and retry_delays is not None else None
    )
    run_id = _record_start(lease, requested_by=requested_by)
    heartbeat = _Heartbeat(lease, max_run_time=max_run_time, started=started)
    heartbeat.start()
    unexpected = False
    interrupted: BaseException | None = None
    try:
        result.stats = dict(fn(lease) or {})
        lease.check()
        result.outcome = "succeeded"
    except LockLost as exc:
        result.outcome, result.error, result.exception = "lost_lock", str(exc) or lease.lost_reason, exc
    except CommitUnknown as exc:  # a database fault: no traceback
        result.outcome, result.error, result.exception = "failed", f"outcome unknown: {exc}", exc
    except Error as exc:
        result.outcome, result.error, result.exception = "failed", f"database error: {error_text(exc)}", exc
    except expected_errors as exc:  # its message may quote an outside system: bounded, one line
        result.outcome, result.error, result.exception = "failed", safe_text(str(exc), limit=ERROR_LIMIT), exc
    except Exception as exc:
        result.outcome, result.error, result.exception, unexpected = "failed", error_text(exc), exc, True
        result.traceback = traceback_text(exc)
    except BaseException as exc:  # KeyboardInterrupt, SystemExit (SIGTERM): record, then go on
        result.outcome, result.error, interrupted = "failed", f"interrupted: {error_text(exc)}", exc
    finally:
        heartbeat.stop()
    if isinstance(result.exception, CommitUnknown) and read_back_commit(lease):
        lease.committed = True  # the database answers again: the write had committed
    after_commit = lease.committed and result.outcome != "succeeded"
    if after_commit:
        # Rule 6: its fenced write committed under the lease, so the work is done; what
        # went wrong afterwards is kept on the run and logged as an ERROR.
        result.outcome = "succeeded"
        result.error = f"after its fenced write committed: {result.error}"
    if result.outcome in {"failed", "lost_lock"}:
        result.retry_after = lease.retry_delay
    result.duration = time.monotonic() - started
    _record_finish(lease, run_id, result)
    level = logging.INFO if result.outcome == "succeeded" and not after_commit else logging.ERROR
    # The exception itself: outside its except block, exc_info=True would log "NoneType: None".
    logger.log(level, "%s", result.describe(), exc_info=result.exception if unexpected else None)
    if interrupted is not None:
        raise interrupted
    return result


def _unreachable(result: RunResult, exc: Exception, started: float) -> RunResult:
    """A skip for a database that cannot be reached; ``LockError`` for one without the lock's table."""
    if isinstance(exc, ProgrammingError | OperationalError) and _missing_table(exc):
        raise LockError(
            f"the lock table is missing ({error_text(exc)}): run `python manage.py migrate`"
        ) from exc
    result.reason = f"database unreachable: {error_text(exc)}"
    result.exception, result.unreachable = exc, True
    result.duration = time.monotonic() - started
    logger.warning("%s", result.describe())
    return result


def _record_start(lease: Lease, *, requested_by: str) -> int | None:
    """Close the runs of earlier tokens still marked ``running`` (their holders died:
    this lease could only be won once theirs expired or was released), then record
    this run. A dead holder whose fenced write had committed (``lease.prior_commit``)
    succeeded: its work is done, only its record was not."""
    try:
        runs = JobRun.objects.for_job(lease.job).filter(status=Outcome.RUNNING, token__lt=lease.token)
        if lease.prior_commit is not None:
            runs.filter(token=lease.prior_commit).update(
                status=Outcome.SUCCEEDED,
                finished_at=Now(),
                error=_dead_holder(
                    f"committed its fenced write, then stopped before recording it; token {lease.token} took over"
                ),
            )
        runs.update(
            status=Outcome.ABANDONED,
            finished_at=Now(),
            error=_dead_holder(f"stopped renewing; its lease expired and token {lease.token} took over"),
        )
        return JobRun.objects.create(
            job_name=lease.job,
            tick=lease.tick,
            attempt=lease.attempt,
            holder=lease.holder,
            token=lease.token,
            started_at=lease.acquired_at,
            requested_by=requested_by,
        ).pk
    except Error as exc:
        logger.warning("job=%s could not record the run start: %s", lease.job, error_text(exc))
        return None


def _dead_holder(what: str) -> Concat:
    """ "holder H <what>", with H the holder on the run's own row."""
    return Concat(Value("holder "), "holder", Value(f" {what}"), output_field=TextField())


def _record_finish(lease: Lease, run_id, result: RunResult) -> None:
    status = Outcome(result.outcome)  # succeeded, failed or lost_lock
    released: bool | None = None
    for attempt in range(2):
        try:
            if released is None:
                released = release(lease=lease, status=status, error=result.error)
                if not released and status == Outcome.SUCCEEDED and not lease.committed:
                    # The job finished, but the lease had changed hands meanwhile: its
                    # work may have overlapped another holder's.
                    status, result.outcome = Outcome.LOST_LOCK, "lost_lock"
                    result.error = (
                        f"lease on {lease.job} (token {lease.token}) was taken over before the run finished"
                    )
            if run_id is not None:
                JobRun.objects.filter(pk=run_id).update(
                    finished_at=Now(),
                    status=status,
                    stats=result.stats,
                    error=result.error,
                    traceback=result.traceback,
                )
            prune_runs(job=lease.job)
            return
        except (Error, RowLocked) as exc:
            if attempt == 0:
                # A fault (network cut, server restart) can leave this connection dead
                # while the database is reachable again: try once more on a new one.
                # The statements match on the token or the run's key, so repeating is harmless.
                connections[router.db_for_write(SyncLock)].close()
                continue
            # The lease expires on its own after its TTL (docs/architecture.md, "The lock").
            logger.warning(
                "job=%s token=%s could not record outcome %s: %s; the lease expires by itself",
                lease.job,
                lease.token,
                status,
                error_text(exc),
            )


def prune_runs(*, job: str) -> int:
    """Delete this job's runs older than LOCKS_RUN_RETENTION_DAYS, in one statement."""
    cutoff = now_plus(-timedelta(days=settings.LOCKS_RUN_RETENTION_DAYS))
    deleted, _ = JobRun.objects.for_job(job).filter(started_at__lt=cutoff).delete()
    return deleted


def _missing_table(exc: Exception) -> bool:
    text = str(exc).lower()
    return "no such table" in text or ("relation" in text and "does not exist" in text)


# --- a registered job (LOCKS_JOBS) --------------------------------------------------------


def run_job(
    *,
    name: str,
    tick: datetime | None = None,
    force: bool = False,
    due: datetime | None = None,
    requested_by: str = "",
) -> RunResult:
    """One run of the job ``name`` under its lease, at most one success per tick across every
    host: the one way a registered job is run (run_job and its aliases, the trigger, the scheduler).

    ``tick``: the slot to claim (``--tick``); else the slot of now (``due``, the scheduler's:
    the latest a run may claim), or under catch_up "all" the oldest one up to it still to run
    (docs/architecture.md, "Catch-up"). ``force`` ignores slots but still needs the lease; a
    pause stops it like any run. ``requested_by``: who asked (``cli``, ``cron``, ``scheduler``,
    ``trigger``, ``admin:<user>``), kept on the run. Raises ``UnknownJob``; ``InvalidTick`` for
    a ``tick`` that is no slot, lies beyond the tick window (unless it is the slot of now) or
    would skip slots under "all"; ``LockError`` when the lock table is missing."""
    job = get_job(name)
    if force and tick is not None:
        raise InvalidTick("force and tick exclude each other: a forced run claims no tick")
    now = timezone.now()
    # The period around now, not around the tick: on an uneven schedule the upcoming slot
    # can lie further ahead than the gap that follows it.
    horizon, bound = schedule.period(job.schedule, now=now, tz=job.timezone), "one schedule period"
    if tick is not None:
        tick = schedule.check_tick(job.schedule, tick, tz=job.timezone)
        if tick != job.current_tick(now=now):  # a later slot than now's only within the tick window
            horizon = schedule.early_window(job.schedule, now=now, window=tick_window(), tz=job.timezone)
            bound = "the tick window"
    claim, behind = None if force else (tick or due or job.current_tick(now=now)), False
    if claim is not None and job.catch_up == ALL:
        try:
            pending = _pending_tick(job, due=claim)
        except Error as exc:
            skipped = RunResult(job=name, tick=claim, holder=make_holder(), outcome="skipped")
            return _unreachable(skipped, exc, time.monotonic())
        if tick is not None and tick > pending:
            raise InvalidTick(
                f"tick {iso(tick)} would skip slots: under catch_up 'all' the slots of {name} run oldest "
                f"first, and the next one is {iso(pending)}"
            )
        claim, behind = pending, pending < claim
    result = run_locked(
        job=job.name,
        tick=claim,
        ttl=job.ttl,
        fn=job.function(),
        expected_errors=job.error_classes(),
        horizon=horizon,
        max_run_time=job.max_run_time,
        retry_delays=job.retry_delays,
        requested_by=requested_by,
    )
    result.behind, skip = behind, result.skip
    if tick is not None and skip is not None and skip.reason == "tick_ahead":
        window, zone = tick_window(), job.timezone
        message = schedule.tick_ahead_message(
            job.schedule, tick, db_now=skip.db_now, horizon=skip.horizon, window=window, bound=bound, tz=zone
        )
        raise InvalidTick(message)
    return result


def run_due(*, name: str, requested_by: str = "") -> Iterator[RunResult]:
    """The job's run of now (``run_job``), then under catch_up "all" one more for each slot
    still behind while each one settles its slot (succeeds, or has the last attempt): what
    ``run_job NAME`` and cron do. Bounded: each run is for a later slot than the one before,
    and at most ``MAX_CATCH_UP`` run."""
    result = run_job(name=name, requested_by=requested_by)
    yield result
    for _more in range(MAX_CATCH_UP):
        if not result.next_due_now:
            return
        result = run_job(name=name, requested_by=requested_by)
        yield result


def _pending_tick(job: Job, *, due: datetime) -> datetime:
    """Under catch_up "all": the oldest slot up to ``due`` not done whose chance is not over
    (within the catch-up window, an attempt left), from the lock row; ``due`` for a job
    that never claimed a tick (a new job starts at its current slot)."""
    row = SyncLock.objects.for_job(job.name).annotate(db_now=Now())
    state = row.values("tick", "tick_done", "tick_attempts", "db_now").first()
    if state is None or state["tick"] is None:
        return due
    return schedule.pending_slot(
        job.schedule,
        claimed=state["tick"],
        settled=state["tick_done"] or state["tick_attempts"] >= job.max_attempts,
        due=due,
        oldest=state["db_now"] - job.catch_up_window,
        tz=job.timezone,
    )
