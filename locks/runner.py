"""A run under its lease: ``run_job`` (a registered job), ``run_locked`` (any function), the heartbeat,
the ``JobRun`` record and ``RunResult``, what it came to and its log line (docs/architecture.md)."""

from __future__ import annotations

import contextlib
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import partial
from multiprocessing.connection import wait as wait_for_any
from typing import Literal, NamedTuple

from django.conf import settings
from django.db import Error, OperationalError, connections, router
from django.db.models import Case, Q, TextField, Value, When
from django.db.models.functions import Concat, Now
from django.utils import timezone

from locks.db import STANDBY, RowLocked, error_text, missing_table, safe_text, standby, traceback_text
from locks.lease import (
    FAILOVER_PAUSER,
    RETRIED,
    ClaimRules,
    CommitUnknown,
    Grant,
    Held,
    Lease,
    LockError,
    LockLost,
    NotCommitted,
    Skip,
    acquire,
    failover_pause_note,
    iso,
    logger,
    make_holder,
    read_back_commit,
    release,
    renew,
    validate_ttl,
)
from locks.models import JobRun, Outcome, SyncLock, Tick, now_plus
from locks.registry import ALL, PAUSE, Job, get_job, jobs, prune_every, tick_window
from locks.schedule import InvalidTick
from locks.tasks import TaskFailed, run_task

# Characters of an expected error's message kept (SyncLock.last_error keeps as many).
ERROR_LIMIT = 2000
# The most runs one run_due makes to catch up slots behind (a day of minutes, and then some).
MAX_CATCH_UP = 2000
# The skips after which no copy asks for the tick again: it is settled, or has no attempt left.
SETTLED = frozenset({"tick_claimed", "attempts_used"})


@dataclass(frozen=True)
class Failure:
    """Why a run did not succeed: its error line, an unexpected exception's traceback, the exception."""

    error: str = ""
    traceback: str = ""  # an unexpected exception's, bounded
    exception: BaseException | None = field(default=None, repr=False, compare=False)


@dataclass
class RunResult:
    """What one run came to, in plain values (no database needed to read it)."""

    job: str
    tick: datetime | None
    holder: str
    outcome: Outcome = Outcome.SKIPPED
    token: int | None = None
    grant: Grant = field(default_factory=Grant)  # its lease's (rules 12, 16)
    skip: Skip | None = None
    reason: str = ""
    stats: dict = field(default_factory=dict)
    failure: Failure = Failure()
    duration: float = 0.0
    claimed: Literal["", "forced", "behind"] = ""  # forced: --force; behind: catch_up "all", an older slot

    def __post_init__(self) -> None:
        self.outcome = Outcome(self.outcome)

    @property
    def ok(self) -> bool:
        return self.outcome.recorded in {Outcome.SUCCEEDED, Outcome.SKIPPED}

    @property
    def next_due_now(self) -> bool:
        """Under catch_up "all": this run settled a slot behind the current one, so the next is due now."""
        if self.claimed != "behind":
            return False
        if self.outcome.recorded in RETRIED:
            return self.grant.retry_delay is None
        settled_elsewhere = self.skip is not None and self.skip.reason in SETTLED
        return self.outcome.recorded == Outcome.SUCCEEDED or settled_elsewhere

    def describe(self) -> str:
        parts = [f"job={self.job}", f"tick={iso(self.tick) or 'forced'}", f"holder={self.holder}"]
        forced = " forced=yes" if self.claimed == "forced" and self.tick else ""  # it retried a slot
        parts.append(f"outcome={self.outcome.recorded}{forced}")
        if self.token is not None:
            parts.append(f"token={self.token}")
        if (attempt := self.grant.attempt) is not None:
            parts.append(f"attempt={attempt}" + (f"/{self.grant.attempts}" if self.grant.attempts else ""))
        parts.extend(f"{key}={value}" for key, value in self.stats.items())
        if self.reason:
            parts.append(f"reason={self.reason}")
        if self.failure.error:
            parts.append(f"error={self.failure.error}")
        parts.append(f"duration={self.duration:.2f}s")
        if self.grant.timeline is not None:  # with the token, the pair that names a lease across failovers
            parts.append(f"timeline={self.grant.timeline}")
        return " ".join(parts)

    def log(self) -> None:
        # An unexpected exception's traceback, outside its except block.
        exc_info = self.failure.exception if self.failure.traceback else None
        logger.log(self.outcome.answer.level, "%s", self.describe(), exc_info=exc_info)


# In a scheduler's worker, its pipes to and from the scheduler and the scheduler's pid: the scheduler renews
# the leases of all its workers in one statement (``locks.scheduler``); None: each run's heartbeat its own.
PARENT: list = [None]
# How often a worker's heartbeat looks whether its scheduler is still its parent: a pipe from a killed
# scheduler need not end (another process it forked may hold a copy of its write end).
PARENT_POLL = 1.0


class Lost(NamedTuple):
    """A lease no longer renewed: the scheduler could not (to its worker), or the worker's run ended or
    ran out of time (to its scheduler; ``reason`` empty when it ended)."""

    job: str
    token: int
    reason: str


class _Heartbeat(threading.Thread):
    """Renews the lease every TTL/3 until the run ends (in a scheduler's worker the scheduler does); when
    it cannot, or after ``max_run_time``, marks it lost (docs/architecture.md, "The rules": 5)."""

    def __init__(self, lease: Lease, *, max_run_time: timedelta | None, started: float) -> None:
        super().__init__(name=f"heartbeat-{lease.job}", daemon=True)
        self.lease = lease
        self.interval = lease.ttl.total_seconds() / 3
        self.overtime = f"ran longer than its maximum run time {max_run_time}"
        self.deadline = started + max_run_time.total_seconds() if max_run_time is not None else None
        self.stopping = threading.Event()
        # Inside fenced(lease) the transaction renewed the lease and holds the lock row: no beat needed.
        self.fenced_holds_row = connections[router.db_for_write(SyncLock)].features.supports_transactions
        self.parent = PARENT[0]
        try:  # the scheduler renews the lease; stop() wakes the wait on the scheduler's pipe
            if self.parent is not None:
                self.parent[0].send(Held(lease.job, lease.token, lease.ttl, lease.grant.timeline))
                self.wake_reader, self.wake_writer = os.pipe()
        except OSError:
            self.parent = None  # its scheduler is gone: this thread renews the lease

    def run(self) -> None:
        if self.parent is not None and not self._told():
            return
        try:
            while not self.stopping.wait(self.interval):
                if self.deadline is not None and time.monotonic() > self.deadline:
                    return self._lost(self.overtime)
                if self.lease.writing.is_set() and self.fenced_holds_row:
                    logger.debug(
                        "job=%s heartbeat: its fenced write holds the lock row; not renewing", self.lease.job
                    )
                    continue
                try:
                    renew(lease=self.lease)
                except LockLost:
                    return self._lost()
                except RowLocked as exc:  # an operator's write, a contender's: for a moment
                    logger.debug("job=%s heartbeat: %s; trying again at the next beat", self.lease.job, exc)
                    continue
                except Error as exc:
                    if isinstance(exc, OperationalError) and self.lease.writing.is_set():
                        # SQLite: this process's own fenced write holds the one write lock.
                        logger.debug(
                            "job=%s heartbeat: %s while this process writes; trying again at the next beat",
                            *(self.lease.job, error_text(exc)),
                        )
                        continue
                    return self._lost(f"heartbeat could not renew the lease: {error_text(exc)}")
        finally:
            connections.close_all()

    def _told(self) -> bool:
        """In a scheduler's worker: wait until the scheduler says the lease is lost, or the maximum run
        time; True when the scheduler is gone (this thread renews the lease from then on)."""
        to_it, from_it, scheduler = self.parent
        with contextlib.suppress(EOFError, OSError):
            while not self.stopping.is_set():
                left = PARENT_POLL if self.deadline is None else max(self.deadline - time.monotonic(), 0)
                if not wait_for_any([from_it, self.wake_reader], timeout=min(left, PARENT_POLL)):
                    if os.getppid() != scheduler:
                        return True  # its scheduler is gone: this thread renews the lease
                    if self.deadline is not None and time.monotonic() >= self.deadline:
                        self._lost(self.overtime)
                        to_it.send(Lost(self.lease.job, self.lease.token, self.lease.lost_reason))
                        return False
                    continue
                if self.stopping.is_set():
                    return False
                told = from_it.recv()  # or a Lost for an earlier lease of this worker, unread by its run
                if (told.job, told.token) == (self.lease.job, self.lease.token):
                    self._lost(told.reason)
                    return False
            return False
        return not (self.stopping.is_set() or self.lease.lost)

    def _lost(self, reason: str = "") -> None:
        if reason:  # else renew() marked it lost
            self.lease.mark_lost(reason)
        logger.warning("job=%s heartbeat: %s", self.lease.job, self.lease.lost_reason)

    def stop(self) -> None:
        self.stopping.set()
        if self.parent is not None:
            os.write(self.wake_writer, b"x")
        self.join(timeout=self.interval + 5)
        if self.parent is None:
            return
        os.close(self.wake_reader)
        os.close(self.wake_writer)
        if not self.lease.lost:  # the scheduler stops renewing it before the run releases it
            with contextlib.suppress(OSError):
                self.parent[0].send(Lost(self.lease.job, self.lease.token, ""))


def run_locked(
    job: str,
    tick: datetime | None,
    ttl: timedelta,
    fn: Callable[[Lease], Mapping | None],
    *,
    holder: str | None = None,
    expected_errors: tuple[type[BaseException], ...] = (),
    max_run_time: timedelta | None = None,
    retry_delays: tuple[timedelta, ...] | None = None,
    requested_by: str = "",
    rules: ClaimRules = ClaimRules(),
) -> RunResult:
    """Run ``fn(lease)`` if this process wins the lease for ``tick``, recorded on a ``JobRun``; never
    raises for the lock's sake (docs/architecture.md, "The lock"). ``expected_errors`` are logged
    without a traceback; ``retry_delays``: a tick's ``1 + len`` attempts (None: no limit); ``rules``:
    how the claim takes its slot (``acquire``)."""
    validate_ttl(ttl)
    if max_run_time is not None and max_run_time <= timedelta(0):
        raise ValueError(f"max_run_time must be positive, got {max_run_time}")
    started = time.monotonic()
    result = RunResult(job=job, tick=tick, holder=holder or make_holder(), claimed="" if tick else "forced")
    with _interrupts(hold=True):
        try:
            connections[router.db_for_write(SyncLock)].ensure_connection()
            lease = acquire(job, tick, ttl, holder=result.holder, retry_delays=retry_delays, rules=rules)
        except Error as exc:
            return _unreachable(result, exc, started)
        if isinstance(lease, Skip):
            return _skipped(result, lease, started)
        result.token, result.grant = lease.token, lease.grant
        result.tick = lease.tick  # a forced run that retries a failed slot names it
        run_id = _record_start(lease, requested_by=requested_by)
        heartbeat = _Heartbeat(lease, max_run_time=max_run_time, started=started)
        heartbeat.start()
        try:
            body = _pause_on_failover if lease.grant.failover and rules.pause_on_failover else fn
            interrupted, started_body = _run_body(body, lease, result, expected_errors)
        finally:
            heartbeat.stop()
        _settle(lease, result)
        result.duration = time.monotonic() - started
        _record_finish(lease, run_id, result, used=started_body)
        result.log()
        if interrupted is not None:
            raise interrupted
        return result


def _skipped(result: RunResult, got: Skip, started: float) -> RunResult:
    result.skip, result.reason = got, str(got)
    if got.reason == "tick_ahead":  # nothing was stored; most likely this host's clock (or a --tick)
        result.outcome = Outcome.TICK_AHEAD
        result.reason += f"; this host's clock is {(timezone.now() - got.db_now).total_seconds():+.0f} s off the database clock"
    return _logged(result, started)


def _logged(result: RunResult, started: float) -> RunResult:
    result.duration = time.monotonic() - started
    result.log()
    return result


class _Held(threading.local):  # Python runs signal handlers in the main thread: its state
    holding = False  # a run is taking or recording its lease
    pending: BaseException | None = None


_held = _Held()


def interrupt(exc: BaseException) -> None:
    """For a signal handler: raise ``exc``, or while a run takes or records its lease, once its body
    begins or it has logged itself (docs/architecture.md, "The scheduler", its last paragraph)."""
    if not _held.holding:
        raise exc
    _held.pending = _held.pending or exc


@contextmanager
def _interrupts(*, hold: bool) -> Iterator[None]:
    before, _held.holding = _held.holding, hold
    try:
        if not hold:
            _raise_held()
        yield
    finally:
        _held.holding = before
        if not before:
            _raise_held()


def _raise_held() -> None:
    pending, _held.pending = _held.pending, None
    if pending is not None:
        raise pending


class PausedOnFailover(NotCommitted):
    """A job whose ``on_failover`` is "pause" met a failover: it paused instead of running."""


def _pause_on_failover(lease: Lease) -> None:
    # acquire paused the job in its claim's transaction: no later run can miss the failover.
    note = failover_pause_note(lease.grant.failover)
    logger.warning(
        "job=%s paused by %s: no copy runs it until it is resumed (note: %s)",
        *(lease.job, FAILOVER_PAUSER, note),
    )
    raise PausedOnFailover(
        f"not run: {note}. Check what its last runs did on the old primary, then resume it "
        f"(`locks resume {lease.job}`)"
    )


def _run_body(fn, lease: Lease, result: RunResult, expected_errors) -> tuple[BaseException | None, bool]:
    """``fn(lease)``'s outcome and failure on ``result``; an interruption, to be raised once the run is
    recorded, and whether its body started (it used one of its tick's attempts: rule 12)."""
    outcome, error, caught, traceback, started, interrupted = Outcome.FAILED, "", None, "", False, None
    try:
        with _interrupts(hold=False):
            started = True
            result.stats = dict(fn(lease) or {})
            lease.check()
        outcome = Outcome.SUCCEEDED
    except LockLost as exc:
        outcome, error, caught = Outcome.LOST_LOCK, str(exc) or lease.lost_reason, exc
    except CommitUnknown as exc:
        outcome, error, caught = Outcome.UNKNOWN, f"outcome unknown: {exc}", exc
    except NotCommitted as exc:
        error, caught = str(exc), exc
    except Error as exc:
        outcome, error, caught = Outcome.FAILED_DATABASE, f"database error: {error_text(exc)}", exc
    except expected_errors as exc:  # its message may quote an outside system: bounded, one line
        outcome, error, caught = Outcome.FAILED_EXPECTED, safe_text(str(exc), limit=ERROR_LIMIT), exc
    except Exception as exc:
        error, caught, traceback = error_text(exc), exc, traceback_text(exc)
    except BaseException as exc:  # KeyboardInterrupt, SystemExit (SIGTERM): record, then go on
        # During its fenced COMMIT: unknown until _settle reads it back (rule 10).
        outcome = Outcome.UNKNOWN if lease.interrupted_commit else Outcome.FAILED
        error, interrupted = f"interrupted: {error_text(exc)}", exc
        if not started:  # before its body: it used no attempt (rule 12)
            error = f"interrupted before its body started ({error_text(exc)}): its attempt is not used"
    result.outcome, result.failure = outcome, Failure(error, traceback, caught)
    return interrupted, started


def _settle(lease: Lease, result: RunResult) -> None:
    """Rule 6: a run whose fenced write committed is a success, whatever went wrong afterwards; an
    unknown COMMIT is read back once more."""
    if result.outcome == Outcome.UNKNOWN and not lease.unconfirmed and read_back_commit(lease):
        lease.committed = True
    if lease.committed and result.outcome != Outcome.SUCCEEDED:
        result.outcome = Outcome.SUCCEEDED_THEN_FAILED
        error = f"after its fenced write committed: {result.failure.error}"
        result.failure = replace(result.failure, error=error)


def _unreachable(result: RunResult, exc: Exception, started: float) -> RunResult:
    """A skip for a database that cannot be reached; ``LockError`` for one without the lock's table."""
    if missing_table(exc):
        raise LockError(
            f"the lock table is missing ({error_text(exc)}): run `python manage.py migrate`"
        ) from exc
    cause = STANDBY if standby(exc) else "database unreachable"  # a standby: the URL or a failover
    result.reason = f"{cause}: {error_text(exc)}"
    result.failure, result.outcome = Failure(exception=exc), Outcome.UNREACHABLE
    return _logged(result, started)


def _record_start(lease: Lease, *, requested_by: str) -> int | None:
    """Settle the runs of earlier tokens (if the claim saw one unsettled), then record this one."""
    try:
        if lease.grant.unsettled:
            _settle_earlier(lease)
        return JobRun.objects.create(
            job_name=lease.job,
            tick=lease.tick,
            attempt=lease.grant.attempt,
            holder=lease.holder,
            token=lease.token,
            started_at=lease.grant.acquired_at,
            requested_by=requested_by,
            timeline=lease.grant.timeline,
            system_id=lease.grant.system_id,
            failover=lease.grant.failover_slot,
        ).pk
    except Error as exc:
        logger.warning("job=%s could not record the run start: %s", lease.job, error_text(exc))
        return None


def _settle_earlier(lease: Lease) -> None:
    """One UPDATE of the unsettled runs (rule 15): ``running`` ones lost their holder, ``unknown``
    ones are resolved by the lock row's last committed token."""
    prior = lease.grant.prior_commit or 0  # tokens start at 1: 0 names no committed write
    committed, running, text = Q(token=prior), Q(status=Outcome.RUNNING), TextField()
    took_over = f"token {lease.token} took over"
    resolved = f"resolved by token {lease.token}: the lock row shows its fenced write"
    stopped = _dead_holder(f"committed its fenced write, then stopped before recording it; {took_over}")
    lost = f"was lost in a failover; token {lease.token_name} took over" if lease.grant.failover else ""
    abandoned = _dead_holder(lost or f"stopped renewing; its lease expired and {took_over}")
    # An unknown run that stopped following its task takes the task's outcome (locks.tasks._settle_outlived).
    unsettled = JobRun.objects.for_job(lease.job).unsettled(before=lease.token, committed=prior)
    unsettled.filter(Q(status=Outcome.RUNNING) | Q(stats__task__isnull=True)).update(
        status=Case(
            When(committed, then=Value(Outcome.SUCCEEDED)),
            When(running, then=Value(Outcome.ABANDONED)),
            default=Value(Outcome.FAILED),
        ),
        error=Case(
            When(committed & running, then=stopped),
            When(committed, then=Value(f"{resolved} committed")),
            When(running, then=abandoned),
            default=Value(f"{resolved} did not commit"),
            output_field=text,
        ),
        # A recorded end stays; one that committed, then stopped unrecorded: its start (never reads late)
        finished_at=Case(
            When(committed & running, then="started_at"), When(running, then=Now()), default="finished_at"
        ),
        failover=Case(When(running & ~committed, then=Value(lease.grant.failover, text)), default="failover"),
    )


def _dead_holder(what: str) -> Concat:
    """ "holder H <what>", with H the holder on the run's own row."""
    return Concat(Value("holder "), "holder", Value(f" {what}"), output_field=TextField())


def _record_finish(lease: Lease, run_id, result: RunResult, *, used: bool) -> None:
    released: bool | None = None
    for attempt in range(2):
        try:
            if released is None:
                released = _release(lease, result, used=used)
            if run_id is not None:
                JobRun.objects.filter(pk=run_id).update(
                    finished_at=Now(),
                    status=result.outcome.recorded,
                    **({"stats": result.stats} if result.stats else {}),  # a task's id stays (locks.tasks)
                    error=result.failure.error,
                    traceback=result.failure.traceback,
                )
            if lease.token % prune_every(lease.job) == 0:  # about hourly, no state kept
                prune_runs(job=lease.job)
            return
        except (Error, RowLocked) as exc:
            if attempt == 0:  # a fault may leave this connection dead: once more on a new one (harmless:
                # the statements match on the token or the run's key)
                connections[router.db_for_write(SyncLock)].close()
                continue
            logger.warning(
                "job=%s token=%s could not record outcome %s: %s; the lease expires by itself",
                *(lease.job, lease.token, result.outcome.recorded, error_text(exc)),
            )


def _release(lease: Lease, result: RunResult, *, used: bool) -> bool:
    """Release the lease with the run's outcome, corrected to ``lost_lock`` for a success whose lease
    changed hands without a committed fenced write, ``failed`` for one the row does not show."""
    try:
        released = release(lease=lease, status=result.outcome.recorded, error=result.failure.error, used=used)
    except NotCommitted as exc:
        result.outcome, result.failure = Outcome.FAILED, replace(result.failure, error=str(exc))
        return True
    if not released and result.outcome.recorded == Outcome.SUCCEEDED and not lease.committed:
        result.outcome = Outcome.LOST_LOCK
        # Taken over: its release set no delay before its tick's next attempt, if it has one (None: none).
        result.grant = result.grant._replace(retry_delay=result.grant.retry_delay and timedelta(0))
        error = f"lease on {lease.job} (token {lease.token}) was taken over before the run finished"
        result.failure = replace(result.failure, error=error)
    return released


def prune_runs(*, job: str) -> int:
    """Delete the runs and tick rows (but this job's latest) older than LOCKS_RUN_RETENTION_DAYS of this
    job and of every job whose lock row is not in LOCKS_JOBS (a removed job's: no run of its own prunes them)."""
    cutoff = now_plus(-timedelta(days=settings.LOCKS_RUN_RETENTION_DAYS))
    removed = SyncLock.objects.exclude(job_name__in=list(jobs())).values_list("job_name", flat=True)
    ours = Q(job_name__in=[job, *removed])  # by name, so the (job, started) index serves the DELETE
    deleted, _ = JobRun.objects.filter(ours, started_at__lt=cutoff).delete()
    latest = Tick.objects.filter(job_name=job).order_by("-tick").values_list("pk", flat=True).first()
    Tick.objects.filter(ours, tick__lt=cutoff).exclude(pk=latest).delete()
    return deleted


# --- a registered job (LOCKS_JOBS) --------------------------------------------------------


def run_job(
    *,
    name: str,
    tick: datetime | None = None,
    force: bool = False,
    due: datetime | None = None,
    slot: datetime | None = None,
    requested_by: str = "",
) -> RunResult:
    """One run of the job ``name`` under its lease: the one way a registered job is run.

    ``tick``: the slot to claim; else the slot of now (``due``, the scheduler's; ``slot``, a crontab
    pass's, the tick window before it), or under catch_up "all" the oldest one still to run up to it;
    ``force``: none (docs/architecture.md, rule 12, "Which slot a run claims"). Raises ``UnknownJob``,
    ``InvalidTick``, ``LockError``."""
    job = get_job(name)
    if force and tick is not None:
        raise InvalidTick("force and tick exclude each other: a forced run claims no tick")
    if tick is not None:
        tick = job.cron.check(tick)
    claim, behind = tick or due or slot or job.current_tick(now=timezone.now()), False
    # The future bound (rule 3): none for the scheduler's slot, else the tick window before the slot.
    window = job.cron.early_window_before(claim, window=tick_window())
    horizon = timedelta(0) if due is not None and tick is None else window
    if job.catch_up.policy == ALL:
        try:
            pending = _pending_tick(job, due=claim)
        except Error as exc:
            forced = {"tick": None, "claimed": "forced"} if force else {"tick": claim}
            result = RunResult(job=name, holder=make_holder(), **forced)
            return _unreachable(result, exc, time.monotonic())
        if tick is not None and tick > pending:
            raise InvalidTick(
                f"tick {iso(tick)} would skip slots: under catch_up 'all' the slots of {name} run oldest "
                f"first, and the next one is {iso(pending)}"
            )
        claim, behind = pending, pending < claim and not force
    task = job.task_path and partial(run_task, task_path=job.task_path, wait=job.max_run_time)
    result = run_locked(
        job.name,
        None if force else claim,
        job.ttl,
        task or job.function(),
        expected_errors=job.error_classes() + ((TaskFailed,) if task else ()),
        max_run_time=job.max_run_time,
        retry_delays=job.retry_delays,
        requested_by=requested_by,
        rules=ClaimRules(horizon, claim if force else None, job.on_failover == PAUSE),
    )
    result.claimed, skip = "behind" if behind else result.claimed, result.skip
    if tick is not None and skip is not None and skip.reason == "tick_ahead":
        args = {"db_now": skip.db_now, "horizon": skip.horizon, "window": tick_window()}
        raise InvalidTick(job.cron.tick_ahead_message(tick, **args))
    return result


def run_due(*, name: str, requested_by: str = "", slot: datetime | None = None) -> Iterator[RunResult]:
    """The job's run of now (``slot``: the one a crontab pass claimed), then under catch_up "all" one for
    each slot behind while each settles its slot, at most ``MAX_CATCH_UP``: what ``run_job NAME`` and cron do."""
    for _run in range(1 + MAX_CATCH_UP):
        result = run_job(name=name, requested_by=requested_by, slot=slot)
        yield result
        if not result.next_due_now:
            return


def _pending_tick(job: Job, *, due: datetime) -> datetime:
    """Under catch_up "all": the oldest slot up to ``due`` still to run, from the lock row (``due`` for
    a job that never claimed a tick)."""
    row = SyncLock.objects.for_job(job.name).annotate(db_now=Now())
    state = row.values("tick", "tick_done", "tick_attempts", "db_now").first()
    if state is None or state["tick"] is None:
        return due
    return job.cron.pending(
        claimed=state["tick"],
        settled=state["tick_done"] or state["tick_attempts"] >= job.max_attempts,
        due=due,
        oldest=state["db_now"] - job.catch_up.window,
    )
