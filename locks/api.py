"""The lease API: the only code that writes ``SyncLock`` rows.

Every state change is one conditional UPDATE (compare-and-set) evaluated by the
database against its own clock (``Now()``), so hosts with skewed clocks agree on
expiry and no read-then-write race exists. See DESIGN "The lock".
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Literal

from django.conf import settings
from django.db import (
    Error,
    IntegrityError,
    OperationalError,
    ProgrammingError,
    connections,
    router,
    transaction,
)
from django.db.models import DateTimeField, ExpressionWrapper, F, Q, Value
from django.db.models.functions import Now
from django.db.models.sql import UpdateQuery
from django.utils import timezone
from django.utils.dateparse import parse_datetime

from locks.models import JobRun, RunStatus, SyncLock

logger = logging.getLogger(__name__)

Outcome = Literal["succeeded", "failed", "lost_lock", "skipped"]


class LockError(Exception):
    """The lock cannot be used at all (for example, its table is missing)."""


class LockLost(RuntimeError):
    """The lease was taken over or could not be renewed; stop before writing."""


class UnknownJob(LookupError):
    pass


def make_holder() -> str:
    """host:pid:suffix; the suffix tells apart two processes that reuse a pid."""
    return f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"


def _validate_ttl(ttl: timedelta) -> timedelta:
    if not isinstance(ttl, timedelta):
        raise TypeError(f"ttl must be a timedelta, got {type(ttl).__name__}")
    if ttl <= timedelta(0):
        raise ValueError(f"ttl must be positive, got {ttl}")
    return ttl


def _expires(ttl: timedelta) -> ExpressionWrapper:
    return ExpressionWrapper(Now() + Value(ttl), output_field=DateTimeField())


# --- results ---------------------------------------------------------------


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
            return f"held by {self.holder} until {_iso(self.locked_until)}"
        return f"tick {_iso(self.claimed_tick)} already claimed by {self.holder}"


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

    def renew(self) -> None:
        renew(lease=self)


@dataclass(frozen=True)
class ForcedRelease:
    job: str
    previous_holder: str
    previous_token: int
    was_held: bool
    token: int


# --- the statements ----------------------------------------------------------


def _update_returning(
    *,
    db: str,
    model,
    build: Callable[[], tuple],
    returning: tuple[str, ...],
    reread: Q,
    compiled: Callable[[], tuple[str, list]] | None = None,
) -> tuple | None:
    """``qs.update(**values)``, with ``(qs, values) = build()``, that also
    returns columns of the updated row.

    A fast path of one statement (UPDATE … RETURNING, compiled by Django so the
    expressions are exactly those of the portable path; ``compiled()`` may
    supply that compilation) on backends that have RETURNING; elsewhere
    ``update()`` followed by a read of the row ``reread`` names. Returns None
    when no row matched.
    """
    connection = connections[db]
    if _can_return(connection):
        sql, params = compiled() if compiled is not None else _compile_update(*build())
        columns = ", ".join(
            connection.ops.quote_name(model._meta.get_field(name).column) for name in returning
        )
        with transaction.mark_for_rollback_on_error(db), connection.cursor() as cursor:
            cursor.execute(f"{sql} RETURNING {columns}", params)
            row = cursor.fetchone()
        return None if row is None else tuple(_from_db(value) for value in row)
    qs, values = build()
    if not qs.update(**values):
        return None
    return model.objects.using(db).filter(reread).values_list(*returning).first()


def _compile_update(qs, values: Mapping) -> tuple[str, list]:
    query = qs.query.chain(UpdateQuery)
    query.add_update_values(values)
    sql, params = query.get_compiler(qs.db).as_sql()
    return sql, list(params)


def _can_return(connection) -> bool:
    return (
        getattr(settings, "LOCKS_USE_RETURNING", True)
        and connection.vendor in {"postgresql", "sqlite"}
        and connection.features.can_return_columns_from_insert
    )


def _from_db(value):
    # SQLite hands back datetimes through a raw cursor as naive UTC, or as text.
    if isinstance(value, str):
        value = parse_datetime(value) or value
    if isinstance(value, datetime) and timezone.is_naive(value):
        return timezone.make_aware(value, UTC)
    return value


def acquire(*, job: str, tick: datetime | None, ttl: timedelta, holder: str | None = None) -> Lease | Skip:
    """Take the lease on ``job`` for ``tick`` (None: any tick, a forced run).

    One compare-and-set: it wins only if the lease is free by the database
    clock and, for a scheduled run, no run has claimed this tick or a later one.
    """
    _validate_ttl(ttl)
    holder = holder or make_holder()
    db = router.db_for_write(SyncLock)
    for _attempt in range(3):
        row = _update_returning(
            db=db,
            model=SyncLock,
            build=lambda: _acquire_update(db=db, job=job, tick=tick, ttl=ttl, holder=holder),
            returning=("token", "acquired_at"),
            reread=Q(job_name=job, holder=holder),
            compiled=lambda: _acquire_sql(db=db, job=job, tick=tick, ttl=ttl, holder=holder),
        )
        if row is not None:
            token, acquired_at = row
            _warn_on_skew(job=job, db_now=acquired_at)
            return Lease(job=job, holder=holder, token=token, tick=tick, ttl=ttl, acquired_at=acquired_at)
        state = (
            SyncLock.objects.using(db)
            .filter(job_name=job)
            .annotate(db_now=Now())
            .values("holder", "locked_until", "tick", "db_now")
            .first()
        )
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


def _acquire_update(*, db: str, job: str, tick: datetime | None, ttl: timedelta, holder: str):
    """The compare-and-set of ``acquire``: the rows it may take, and what it sets."""
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
    condition = Q(locked_until__isnull=True) | Q(locked_until__lt=Now())
    if tick is not None:
        values["tick"] = tick
        condition &= Q(tick__isnull=True) | Q(tick__lt=tick)
    return SyncLock.objects.using(db).filter(condition, job_name=job), values


# Compiling the acquire UPDATE costs several times more than running it
# (docs/benchmarks.md). On the RETURNING path its SQL is compiled once per
# shape (database, job, TTL, scheduled or forced) with stand-in values for the
# holder and the tick; the stand-ins' places in the parameters are checked
# against a real compilation, then reused with the real values put back.
_STAND_IN_HOLDER = "\x00stand-in holder\x00"
_STAND_IN_TICK = datetime(1901, 2, 3, 4, 5, 6, 789012, tzinfo=UTC)
_acquire_templates: dict[tuple, _Template | None] = {}


@dataclass(frozen=True)
class _Template:
    sql: str
    params: tuple
    holder_at: tuple[int, ...]
    tick_at: tuple[int, ...]

    def fill(self, *, holder: str, tick_value) -> list:
        params = list(self.params)
        for index in self.holder_at:
            params[index] = holder
        for index in self.tick_at:
            params[index] = tick_value
        return params


def _acquire_sql(
    *, db: str, job: str, tick: datetime | None, ttl: timedelta, holder: str
) -> tuple[str, list]:
    key = (db, job, tick is None, ttl, settings.USE_TZ)
    template = _acquire_templates.get(key, False)
    if template is False or template is None:
        sql, params = _compile_update(*_acquire_update(db=db, job=job, tick=tick, ttl=ttl, holder=holder))
        if template is False:
            _acquire_templates[key] = _learn(
                db=db, job=job, tick=tick, ttl=ttl, holder=holder, real=(sql, params)
            )
        return sql, params
    return template.sql, template.fill(holder=holder, tick_value=_tick_value(tick, db))


def _learn(
    *, db: str, job: str, tick: datetime | None, ttl: timedelta, holder: str, real: tuple[str, list]
) -> _Template | None:
    """The template for this shape, or None (compile every time) if the stand-ins
    cannot be told apart or the template does not reproduce ``real`` exactly."""
    stand_in_tick = None if tick is None else _STAND_IN_TICK
    sql, params = _compile_update(
        *_acquire_update(db=db, job=job, tick=stand_in_tick, ttl=ttl, holder=_STAND_IN_HOLDER)
    )
    holder_at = tuple(index for index, value in enumerate(params) if value == _STAND_IN_HOLDER)
    tick_at = ()
    if tick is not None:
        stand_in = _tick_value(_STAND_IN_TICK, db)
        tick_at = tuple(index for index, value in enumerate(params) if value == stand_in)
    template = _Template(sql, tuple(params), holder_at, tick_at)
    expected = (1, 0 if tick is None else 2)  # holder in SET; tick in SET and WHERE
    if (len(holder_at), len(tick_at)) != expected or (
        template.sql,
        template.fill(holder=holder, tick_value=_tick_value(tick, db)),
    ) != real:
        logger.debug("job=%s acquire: statement not reusable, compiling each time", job)
        return None
    return template


def _tick_value(tick: datetime | None, db: str):
    return SyncLock._meta.get_field("tick").get_db_prep_value(tick, connections[db])


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
    for _attempt in range(5):
        row = SyncLock.objects.filter(job_name=job).values("holder", "token", "locked_until").first()
        if row is None:
            known = ", ".join(SyncLock.objects.values_list("job_name", flat=True)) or "none yet"
            raise UnknownJob(f"no lock named {job!r} (known jobs: {known})")
        if row["locked_until"] is None:
            return ForcedRelease(job, row["holder"], row["token"], False, row["token"])
        # Compare-and-set on the token we read: a new holder in between is not released.
        if SyncLock.objects.filter(job_name=job, token=row["token"]).update(
            holder="",
            locked_until=None,
            token=F("token") + 1,
            last_finished_at=Now(),
            last_status=RunStatus.RELEASED,
            last_error=f"force-released by {by or 'unknown'}; holder was {row['holder']}",
        ):
            # The released holder's run can no longer finish under its lease; if the
            # holder is alive its own bookkeeping may still overwrite this.
            JobRun.objects.for_job(job).filter(token=row["token"], status=RunStatus.RUNNING).update(
                status=RunStatus.LOST_LOCK,
                finished_at=Now(),
                error=f"force-released by {by or 'unknown'}",
            )
            logger.warning(
                "job=%s force-released by %s; previous holder %s (token %s), new token %s",
                job,
                by or "unknown",
                row["holder"],
                row["token"],
                row["token"] + 1,
            )
            return ForcedRelease(job, row["holder"], row["token"], True, row["token"] + 1)
    raise LockError(f"lock {job!r} kept changing while it was being released; try again")


# --- running a job under a lease --------------------------------------------


class _Heartbeat(threading.Thread):
    def __init__(self, lease: Lease) -> None:
        super().__init__(name=f"heartbeat-{lease.job}", daemon=True)
        self.lease = lease
        self.interval = lease.ttl.total_seconds() / 3
        self.stopping = threading.Event()

    def run(self) -> None:
        try:
            while not self.stopping.wait(self.interval):
                try:
                    renew(lease=self.lease)
                except LockLost:
                    logger.warning("job=%s heartbeat: %s", self.lease.job, self.lease.lost_reason)
                    return
                except Error as exc:
                    self.lease.mark_lost(f"heartbeat could not renew the lease: {_describe(exc)}")
                    logger.warning("job=%s heartbeat: %s", self.lease.job, self.lease.lost_reason)
                    return
        finally:
            connections.close_all()

    def stop(self) -> None:
        self.stopping.set()
        self.join(timeout=self.interval + 5)


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
    duration: float = 0.0
    # What made the run fail or be skipped for an unreachable database, so callers
    # can tell causes apart (an HTTP trigger maps them to status codes).
    exception: BaseException | None = field(default=None, repr=False, compare=False)

    @property
    def ok(self) -> bool:
        return self.outcome in {"succeeded", "skipped"}

    def describe(self) -> str:
        parts = [f"job={self.job}", f"tick={_iso(self.tick) or 'forced'}", f"holder={self.holder}"]
        parts.append(f"outcome={self.outcome}")
        if self.token is not None:
            parts.append(f"token={self.token}")
        parts.extend(f"{key}={value}" for key, value in self.stats.items())
        if self.reason:
            parts.append(f"reason={self.reason}")
        if self.error:
            parts.append(f"error={self.error}")
        parts.append(f"duration={self.duration:.2f}s")
        return " ".join(parts)


def run_locked(
    *,
    job: str,
    tick: datetime | None,
    ttl: timedelta,
    fn: Callable[[Lease], Mapping | None],
    holder: str | None = None,
    expected_errors: tuple[type[BaseException], ...] = (),
) -> RunResult:
    """Run ``fn(lease)`` if this process wins the lease for ``tick``.

    Never raises for the lock's sake: an unreachable database or a lease held
    elsewhere is a skip; a failure inside ``fn`` is recorded on a ``JobRun``
    and returned. A heartbeat thread renews the lease every TTL/3; ``fn``
    calls ``lease.check()`` (or renews inside its write transaction) before
    writing. Errors in ``expected_errors`` and database errors are logged
    without a traceback; anything else is a bug and keeps its traceback.
    """
    _validate_ttl(ttl)
    holder = holder or make_holder()
    started = time.monotonic()
    result = RunResult(job=job, tick=tick, holder=holder, outcome="skipped")
    try:
        connections[router.db_for_write(SyncLock)].ensure_connection()
        got = acquire(job=job, tick=tick, ttl=ttl, holder=holder)
    except (ProgrammingError, OperationalError) as exc:
        if _missing_table(exc):
            raise LockError(
                f"the lock table is missing ({_describe(exc)}): run `python manage.py migrate`"
            ) from exc
        return _unreachable(result, exc, started)
    except Error as exc:
        return _unreachable(result, exc, started)

    if isinstance(got, Skip):
        result.skip, result.reason = got, str(got)
        result.duration = time.monotonic() - started
        logger.info("%s", result.describe())
        return result

    lease = got
    result.token = lease.token
    run_id = _record_start(lease)
    heartbeat = _Heartbeat(lease)
    heartbeat.start()
    traceback = False
    interrupted: BaseException | None = None
    try:
        result.stats = dict(fn(lease) or {})
        lease.check()
        result.outcome = "succeeded"
    except LockLost as exc:
        result.outcome, result.error = "lost_lock", str(exc) or lease.lost_reason
        result.exception = exc
    except Error as exc:
        result.outcome, result.error = "failed", f"database error: {_describe(exc)}"
        result.exception = exc
    except expected_errors as exc:
        result.outcome, result.error = "failed", str(exc)
        result.exception = exc
    except Exception as exc:
        result.outcome, result.error, traceback = "failed", _describe(exc), True
        result.exception = exc
    except BaseException as exc:  # KeyboardInterrupt, SystemExit (SIGTERM): record, then go on
        result.outcome, result.error, interrupted = "failed", f"interrupted: {_describe(exc)}", exc
    finally:
        heartbeat.stop()
    result.duration = time.monotonic() - started
    _record_finish(lease, run_id, result)
    level = logging.INFO if result.outcome == "succeeded" else logging.ERROR
    logger.log(level, "%s", result.describe(), exc_info=traceback)
    if interrupted is not None:
        raise interrupted
    return result


def _unreachable(result: RunResult, exc: Exception, started: float) -> RunResult:
    result.reason = f"database unreachable: {_describe(exc)}"
    result.exception = exc
    result.duration = time.monotonic() - started
    logger.warning("%s", result.describe())
    return result


def _record_start(lease: Lease) -> int | None:
    try:
        return JobRun.objects.create(
            job_name=lease.job,
            tick=lease.tick,
            holder=lease.holder,
            token=lease.token,
            started_at=lease.acquired_at,
        ).pk
    except Error as exc:
        logger.warning("job=%s could not record the run start: %s", lease.job, _describe(exc))
        return None


def _record_finish(lease: Lease, run_id, result: RunResult) -> None:
    status = {
        "succeeded": RunStatus.SUCCEEDED,
        "failed": RunStatus.FAILED,
        "lost_lock": RunStatus.LOST_LOCK,
    }[result.outcome]
    released: bool | None = None
    for attempt in range(2):
        try:
            if released is None:
                released = release(lease=lease, status=status, error=result.error)
                if not released and status == RunStatus.SUCCEEDED:
                    # The job finished, but the lease had changed hands meanwhile: its
                    # work may have overlapped another holder's.
                    status, result.outcome = RunStatus.LOST_LOCK, "lost_lock"
                    result.error = (
                        f"lease on {lease.job} (token {lease.token}) was taken over before the run finished"
                    )
            if run_id is not None:
                JobRun.objects.filter(pk=run_id).update(
                    finished_at=Now(), status=status, stats=result.stats, error=result.error
                )
            prune_runs(job=lease.job)
            return
        except Error as exc:
            if attempt == 0:
                # A fault (network cut, server restart) can leave this connection dead
                # while the database is reachable again: try once more on a new one.
                # The statements match on the token or the run's key, so repeating is harmless.
                connections[router.db_for_write(SyncLock)].close()
                continue
            # The lease expires on its own after its TTL (lock semantic 4).
            logger.warning(
                "job=%s token=%s could not record outcome %s: %s; the lease expires by itself",
                lease.job,
                lease.token,
                status,
                _describe(exc),
            )


def prune_runs(*, job: str) -> int:
    """Delete this job's runs older than LOCKS_RUN_RETENTION_DAYS, in one statement."""
    days = getattr(settings, "LOCKS_RUN_RETENTION_DAYS", 30)
    cutoff = ExpressionWrapper(Now() - Value(timedelta(days=days)), output_field=DateTimeField())
    deleted, _ = JobRun.objects.for_job(job).filter(started_at__lt=cutoff).delete()
    return deleted


def _missing_table(exc: Exception) -> bool:
    text = str(exc).lower()
    return "no such table" in text or ("relation" in text and "does not exist" in text)


def _describe(exc: BaseException) -> str:
    message = " ".join(str(exc).split()) or "no details"
    return f"{type(exc).__name__}: {message}"


def _iso(value: datetime | None) -> str:
    return value.isoformat() if value is not None else ""
