"""The operator's writes on a job: pause, resume, force release, reset of the claimed tick and run now. Each is a compare-and-set on what the operator saw, never waits on a lock row locked by a write in progress longer than ``OPERATOR_WAIT``, names who acted the same way everywhere (``admin:alice``, ``cli:root``) and logs one WARNING; the admin adds a ``LogEntry`` (docs/architecture.md, "The rules": 9 and 14)."""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from datetime import datetime

from django.conf import settings
from django.db import IntegrityError, router, transaction
from django.db.models import F
from django.db.models.functions import Now

from locks.db import RowLocked, safe_text, unlocked, without_waiting
from locks.lease import LockError, iso
from locks.models import EXPIRED, FREE, HELD, OVERDUE, PAUSE_FIELDS, JobPause, JobRun, Outcome, SyncLock
from locks.registry import UnknownJob, get_job

# --- from operations.py ---

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
                last_status=Outcome.RELEASED,
                last_error=f"force-released by {by}; holder was {holder}",
            )
        ):
            # The released holder's run can no longer finish under its lease; if the
            # holder is alive its own bookkeeping may still overwrite this.
            JobRun.objects.for_job(job).filter(token=token, status=Outcome.RUNNING).update(
                status=Outcome.LOST_LOCK, finished_at=Now(), error=f"force-released by {by}"
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


# --- from pausing.py ---

# The name the lock's log lines have always carried (operators filter on it).
logger = logging.getLogger("locks.api")

NOTE_LIMIT = 500  # characters of a note kept: it is repeated on every skip line


@dataclass(frozen=True)
class PauseState:
    """A job's pause after ``pause_job`` or ``resume_job``; ``changed``: this call changed it
    (False: it was already paused, or not paused)."""

    job: str
    changed: bool
    paused_at: datetime | None
    paused_by: str
    paused_note: str

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    def describe(self) -> str:
        if not self.paused:
            return f"{self.job} is not paused"
        note = f": {self.paused_note}" if self.paused_note else ""
        return f"{self.job} is paused by {self.paused_by} since {iso(self.paused_at)}{note}"


def ensure_lock_row(*, job: str) -> None:
    """The job's lock row, created free if it has none yet (as its first run would)."""
    if SyncLock.objects.for_job(job).exists():
        return
    try:
        with transaction.atomic(using=router.db_for_write(SyncLock)):
            SyncLock.objects.create(job_name=job)
    except IntegrityError:
        pass  # another process created it first


def pause_job(*, job: str, by: str, note: str = "") -> PauseState:
    """Pause the registered ``job`` (``UnknownJob`` otherwise) with ``note``; a job already
    paused keeps its pause, who and note included."""
    get_job(job)
    note = safe_text(" ".join(note.split()), limit=NOTE_LIMIT)  # one line: it goes into log lines
    ensure_lock_row(job=job)
    rows = SyncLock.objects.for_job(job)
    with transaction.atomic(using=router.db_for_write(SyncLock)):
        changed = bool(
            rows.filter(paused_at__isnull=True).update(paused_at=Now(), paused_by=by, paused_note=note)
        )
        row = rows.values(*PAUSE_FIELDS).get()
        if changed:
            JobPause.objects.create(job_name=job, paused_at=row["paused_at"], paused_by=by, note=note)
    state = PauseState(job, changed, row["paused_at"], row["paused_by"], row["paused_note"])
    if changed:
        logger.warning(
            "job=%s paused by %s: no copy runs it until it is resumed (note: %s)", job, by, note or "-"
        )
    return state


def resume_job(*, job: str, by: str) -> PauseState:
    """Resume the registered ``job``: its next slot runs as usual, and so does a slot whose
    chance is not over yet; slots whose chance passed while it was paused stay ``paused``."""
    get_job(job)
    rows = SyncLock.objects.for_job(job)
    with transaction.atomic(using=router.db_for_write(SyncLock)):
        row = rows.values(*PAUSE_FIELDS).first()
        changed = bool(
            row is not None
            and row["paused_at"] is not None
            # Not on the time read: SQLite keeps Now() with three decimals, a Python value with six.
            and rows.filter(paused_at__isnull=False).update(paused_at=None, paused_by="", paused_note="")
        )
        if changed:
            JobPause.objects.filter(job_name=job, resumed_at__isnull=True).update(
                resumed_at=Now(), resumed_by=by
            )
    if changed:
        logger.warning(
            "job=%s resumed by %s; it was paused by %s since %s",
            job,
            by,
            row["paused_by"],
            iso(row["paused_at"]),
        )
    return PauseState(job, changed, None, "", "")


# --- from run_now.py ---

logger = logging.getLogger("locks.api")


def run_now_command(*, job: str, requested_by: str) -> list[str]:
    """This interpreter's ``python -m django run_job …`` under this process's settings module
    (overridden settings, as in tests, name none: then the environment's)."""
    module = settings.SETTINGS_MODULE or os.environ.get("DJANGO_SETTINGS_MODULE")
    return [
        sys.executable,
        *("-m", "django", "run_job", job, "--force", "--requested-by", requested_by),
        *(("--settings", module) if module else ()),
    ]


def start_run_now(*, job: str, requested_by: str) -> int:
    """Start a forced run of ``job`` in the background and return its pid; raises ``OSError`` when
    it cannot be started. It inherits this process's environment and import path (so it reaches
    the same database), runs in a session of its own (a worker that restarts does not stop it),
    and writes its log line to this process's stderr; a thread waits for it, so it leaves no zombie."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
    process = subprocess.Popen(
        run_now_command(job=job, requested_by=requested_by),
        cwd=os.getcwd(),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    threading.Thread(target=process.wait, name=f"run-now-{job}-{process.pid}", daemon=True).start()
    logger.warning("job=%s run now requested by %s: started pid %s", job, requested_by, process.pid)
    return process.pid
