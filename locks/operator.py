"""The operator's writes on a job (``manage.py locks`` and the admin): pause, resume, force release,
reset of the claimed tick and run now (docs/architecture.md, "The rules": 9 and 14)."""

from __future__ import annotations

import getpass
import logging
import os
import subprocess
import sys
import threading
from dataclasses import dataclass
from datetime import datetime, timedelta

from django.conf import settings
from django.db import router
from django.db.models import F, Max, Q
from django.db.models.functions import Now

from locks.db import RowLocked, error_text, lease_transaction, safe_text, unlocked, without_waiting
from locks.lease import CREATE_WAIT, NOTE_LIMIT, LockError, Pause, create_lock_row, iso
from locks.models import (
    EXPIRED,
    FREE,
    HELD,
    OVERDUE,
    PAUSE_FIELDS,
    JobPause,
    JobRun,
    Outcome,
    SyncLock,
    Tick,
    database_now,
    now_plus,
)
from locks.registry import UnknownJob, get_job

# The name the lock's log lines have always carried (operators filter on it).
logger = logging.getLogger("locks.api")
# How long an operator's write waits for a lock row locked by a write in progress.
OPERATOR_WAIT = 5.0
FROZEN_HINT = (
    "nothing changed. A holder frozen inside its fenced write keeps the row locked until its transaction "
    "ends (on PostgreSQL the server ends it within the job's lease TTL): try again then"
)
# A run-now request whose run never took the lease (its process died at start) stops blocking
# another request after this long.
REQUEST_STALE = timedelta(seconds=60)


def admin_name(user) -> str:
    """``admin:<username>``: who acted in the admin, as runs, pauses and log lines record it."""
    return f"admin:{user.get_username()}"


def cli_name() -> str:
    """``cli:<OS user>``: who acted from the command line."""
    try:
        return f"cli:{getpass.getuser()}"
    except (KeyError, OSError):  # no user name in this container's environment or passwd
        return "cli"


@dataclass(frozen=True)
class Change:
    """What one operator's write did. ``changed``: this call changed the row; otherwise ``detail``
    says why not (empty when there was nothing to do). The other fields are what the row showed."""

    job: str
    changed: bool
    detail: str = ""
    previous_holder: str = ""
    previous_token: int | None = None
    token: int | None = None
    previous_tick: datetime | None = None
    was_done: bool = False
    paused_at: datetime | None = None
    paused_by: str = ""
    paused_note: str = ""
    pid: int | None = None

    @property
    def paused(self) -> bool:
        return self.paused_at is not None

    def describe(self) -> str:
        """ "J is paused by X since T: note" (``Pause``), or "J is not paused"."""
        if not self.paused:
            return f"{self.job} is not paused"
        return f"{self.job} is {Pause(self.paused_by, self.paused_at, self.paused_note)}"


def _write(operation, *, job: str, what: str):
    """``operation(rows)`` in a transaction that takes the lock row of ``job`` without waiting for
    a write in progress longer than ``OPERATOR_WAIT`` (``RowLocked``, saying so)."""
    using = router.db_for_write(SyncLock)
    rows = SyncLock.objects.using(using).for_job(job)

    def write():
        with lease_transaction(using=using):
            return operation(rows, unlocked(rows, using=using, skip=False))

    try:
        return without_waiting(write, using=using, within=OPERATOR_WAIT, what=f"{what} of {job}")
    except RowLocked as exc:
        raise RowLocked(f"{exc}; {FROZEN_HINT}") from exc


def ensure_lock_row(*, job: str) -> None:
    """The job's lock row, created free if it has none yet; behind another's insert, ``RowLocked``."""
    if not SyncLock.objects.for_job(job).exists() and not create_lock_row(job=job):
        raise RowLocked(
            f"creation of the lock row of {job}: another process's insert of it has not committed "
            f"within {CREATE_WAIT:g} s; nothing changed, try again"
        )


def _row(job: str, locked, fields: tuple[str, ...]) -> dict:
    """The lock row's ``fields`` (with its state); ``UnknownJob`` naming the known locks if it has none."""
    row = locked.with_state().values(*fields).first()
    if row is None:
        known = ", ".join(SyncLock.objects.values_list("job_name", flat=True)) or "none yet"
        raise UnknownJob(f"no lock named {job!r} (known jobs: {known})")
    return row


def _not_held(row: dict) -> str:
    if row["state"] == EXPIRED:
        return (
            f"(its lease expired at {iso(row['locked_until'])} without being released; "
            "the next run takes it over)"
        )
    return f"(finished as {row['last_status'] or 'nothing yet'})"


def pause_job(*, job: str, by: str, note: str = "") -> Change:
    """Pause the registered ``job`` (a run holding the lease finishes); one already paused keeps its pause."""
    get_job(job)
    note = safe_text(" ".join(note.split()), limit=NOTE_LIMIT)  # one line: it goes into log lines
    ensure_lock_row(job=job)

    def pause(rows, locked) -> Change:
        changed = bool(
            locked.filter(paused_at__isnull=True).update(paused_at=Now(), paused_by=by, paused_note=note)
        )
        row = rows.values("paused_at", "paused_by", "paused_note").get()
        if changed:
            JobPause.objects.create(job_name=job, paused_at=row["paused_at"], paused_by=by, note=note)
        return Change(job, changed, **row)

    state = _write(pause, job=job, what="pause")
    if state.changed:
        logger.warning(
            "job=%s paused by %s: no copy runs it until it is resumed (note: %s)", job, by, note or "-"
        )
    return state


def resume_job(*, job: str, by: str) -> Change:
    """Resume the registered ``job``: slots whose chance passed while it was paused stay ``paused``."""
    get_job(job)

    def resume(rows, locked) -> Change:
        row = rows.values("paused_at", "paused_by").first()
        # Not on the time read: SQLite keeps Now() with three decimals, a Python value with six.
        changed = bool(
            row is not None
            and row["paused_at"] is not None
            and locked.filter(paused_at__isnull=False).update(paused_at=None, paused_by="", paused_note="")
        )
        if changed:
            JobPause.objects.filter(job_name=job, resumed_at__isnull=True).update(
                resumed_at=Now(), resumed_by=by
            )
            logger.warning(
                "job=%s resumed by %s; it was paused by %s since %s",
                *(job, by, row["paused_by"], iso(row["paused_at"])),
            )
        return Change(job, changed)

    return _write(resume, job=job, what="resume")


def force_release(*, job: str, expected_token: int | None = None, by: str = "") -> Change:
    """Clear the lease on ``job`` while it is held and bump the fencing token; with
    ``expected_token``, only the lease with that token (docs/architecture.md, rule 9)."""
    by = by or "unknown"
    return _write(
        lambda rows, locked: _release(job, rows, locked, expected_token, by), job=job, what="force release"
    )


def _release(job: str, rows, locked, expected_token: int | None, by: str) -> Change:
    fields = ("holder", "token", "state", "last_status", "locked_until", "committed_token")
    for _attempt in range(5):
        row = _row(job, locked, fields)
        holder, token = row["holder"], row["token"]
        seen = {"previous_holder": holder, "previous_token": token, "token": token}
        if expected_token is not None and token != expected_token:
            now = f" held by {holder}" if row["state"] in {HELD, OVERDUE} else f", not held {_not_held(row)}"
            return Change(job, False, f"lease on {job} is now token {token}{now}; nothing released", **seen)
        if row["state"] not in {HELD, OVERDUE}:
            quiet = expected_token is None and row["state"] == FREE
            detail = f"lease on {job} (token {token}) is not held any more {_not_held(row)}; nothing released"
            return Change(job, False, "" if quiet else detail, **seen)
        # Compare-and-set on the token read, while still held: a new holder in between, or a
        # holder that finished meanwhile, is not released.
        cleared = {"holder": "", "locked_until": None, "token": F("token") + 1, "last_finished_at": Now()}
        last = {"last_status": Outcome.RELEASED, "last_error": f"force-released by {by}; holder was {holder}"}
        if rows.filter(token=token).held().update(**cleared, **last):
            committed = row["committed_token"] == token
            JobRun.objects.for_job(job).filter(token=token, status=Outcome.RUNNING).update(
                status=Outcome.SUCCEEDED if committed else Outcome.LOST_LOCK,
                finished_at=Now(),
                error=f"force-released by {by}" + (" after its fenced write committed" if committed else ""),
            )
            logger.warning(
                "job=%s force-released by %s; previous holder %s (token %s), new token %s",
                *(job, by, holder, token, token + 1),
            )
            return Change(job, True, **{**seen, "token": token + 1})
    raise LockError(f"lock {job!r} kept changing while it was being released; try again")


def reset_tick(
    *,
    job: str,
    expected_tick: datetime | None,
    expected_token: int | None = None,
    expected_done: bool | None = None,
    by: str = "",
) -> Change:
    """Forget the tick ``job`` claimed last, its done mark and its attempts (the row goes back to the
    last slot before it that succeeded), while the row shows what the operator saw, no lease is held
    and the tick is not done and past; else ``detail`` says why."""
    by = by or "unknown"
    shown = {"tick": expected_tick, "token": expected_token, "tick_done": expected_done}
    return _write(lambda rows, locked: _reset(job, rows, locked, shown, by), job=job, what="tick reset")


def _reset(job: str, rows, locked, shown: dict, by: str) -> Change:
    row = _row(job, locked, ("token", "tick", "tick_done", "state", "holder", "locked_until", "db_now"))
    tick, done = row["tick"], row["tick_done"]
    if tick is None:
        return Change(job, False)
    state = "done" if done else "not done"
    seen, detail = {"previous_tick": tick, "was_done": done}, ""
    if row["state"] in {HELD, OVERDUE}:
        detail = (
            f"the lease on {job} is held by {row['holder']} (token {row['token']}) until "
            f"{iso(row['locked_until'])}: a reset now could let its tick {iso(tick)} run twice"
        )
    elif tick != shown["tick"]:
        detail = f"the claimed tick of {job} is now {iso(tick)} ({state}), not the {iso(shown['tick'])} shown"
    elif shown["tick_done"] is not None and done != shown["tick_done"]:
        detail = f"the claimed tick {iso(tick)} of {job} is {state} now, unlike what was shown"
    elif shown["token"] is not None and row["token"] != shown["token"]:
        detail = f"lease on {job} is now token {row['token']}, not the {shown['token']} shown"
    elif done and tick <= row["db_now"]:  # a reset is for a future tick that blocks the real ones
        detail = f"the claimed tick {iso(tick)} of {job} is done: a reset would let that slot run twice"
    if detail:
        return Change(job, False, f"{detail}; nothing reset", **seen)
    # Back to the last slot before it that succeeded, done, so that slot cannot run again (was: none).
    last = JobRun.objects.for_job(job).succeeded().filter(tick__lt=tick).aggregate(last=Max("tick"))["last"]
    cleared = {"tick": last, "tick_done": last is not None, "tick_attempts": 0, "retry_at": None}
    # Compare-and-set on what was read, the lease free (the row is locked meanwhile where it can be).
    if not rows.filter(token=row["token"], tick=tick, tick_done=done).free().update(**cleared):
        return Change(job, False, "the lock row changed meanwhile; nothing reset", **seen)
    # The tick rows of the slots it reopened (not succeeded): open to every copy of run_scheduler again.
    reopened = Tick.objects.using(rows.db).filter(job_name=job).exclude(status=Outcome.SUCCEEDED)
    (reopened.filter(tick__gt=last) if last is not None else reopened).update(until=Now(), status="reset")
    logger.warning("job=%s claimed tick reset by %s; it was %s (%s)", job, by, iso(tick), state)
    return Change(job, True, **seen)


def run_now(*, job: str, by: str) -> Change:
    """A forced run of the registered ``job`` (``run_job NAME --force``) in a background process,
    once the lock row records the request; one that cannot start leaves a failed run with its error."""
    get_job(job)
    ensure_lock_row(job=job)
    asked = _write(lambda rows, locked: _request(job, rows, locked, by), job=job, what="run now")
    if not asked.changed:
        return asked
    try:
        pid = _start(job=job, by=by)
    except OSError as exc:
        error = f"run now requested by {by} could not start: {error_text(exc)}"
        token = SyncLock.objects.for_job(job).values_list("token", flat=True).get()
        now = database_now()  # plain values: MongoDB inserts no expression
        run = {"job_name": job, "holder": "-", "token": token, "started_at": now, "finished_at": now}
        JobRun.objects.create(**run, status=Outcome.FAILED, error=error, requested_by=by)
        end_run_request(job=job, by=by)
        logger.warning("job=%s %s", job, error)
        return Change(job, False, error)
    logger.warning("job=%s run now requested by %s: started pid %s", job, by, pid)
    return Change(job, True, pid=pid)


def _request(job: str, rows, locked, by: str) -> Change:
    """Run now's compare-and-set: the job not paused, its lease free, no request pending."""
    fresh = Q(run_requested_at__isnull=True) | Q(run_requested_at__lt=now_plus(-REQUEST_STALE))
    asked = {"run_requested_at": Now(), "run_requested_by": by}
    if locked.free().filter(fresh, paused_at__isnull=True).update(**asked):
        return Change(job, True)
    fields = ("state", "holder", "locked_until", "run_requested_by", "run_requested_at", *PAUSE_FIELDS)
    row = rows.with_state().values(*fields).get()
    if row["paused_at"] is not None:
        why = f"{Change(job, False, **{key: row[key] for key in PAUSE_FIELDS}).describe()}: resume it first"
    elif row["state"] in {HELD, OVERDUE}:
        why = f"{job} is running now (held by {row['holder']} until {iso(row['locked_until'])})"
    else:
        why = f"a run of {job} was requested by {row['run_requested_by']} at {iso(row['run_requested_at'])} and has not ended"
    return Change(job, False, f"{why}; nothing started")


def end_run_request(*, job: str, by: str) -> None:
    """The requested run ended (or never started): another request may start one (one it cannot
    end within ``OPERATOR_WAIT`` goes stale by itself after ``REQUEST_STALE``)."""

    def end(rows, locked) -> int:
        return locked.filter(run_requested_by=by).update(run_requested_at=None, run_requested_by="")

    try:
        _write(end, job=job, what="end of the run request")
    except RowLocked as exc:
        logger.warning("job=%s %s", job, exc)


def run_now_command(*, job: str, requested_by: str) -> list[str]:
    """This interpreter's ``python -m django run_job …`` under this process's settings module, else
    the environment's (overridden settings, as in tests, name none)."""
    module = settings.SETTINGS_MODULE or os.environ.get("DJANGO_SETTINGS_MODULE")
    return [
        sys.executable,
        *("-m", "django", "run_job", job, "--force", "--requested-by", requested_by),
        *(("--settings", module) if module else ()),
    ]


def _start(*, job: str, by: str) -> int:
    """Start the run in a session of its own with this process's environment and import path; its
    pid (``OSError`` when it cannot be). A thread waits for it: no zombie."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
    detached = {"stdin": subprocess.DEVNULL, "stdout": subprocess.DEVNULL, "start_new_session": True}
    process = subprocess.Popen(
        run_now_command(job=job, requested_by=by), cwd=os.getcwd(), env=env, **detached
    )
    threading.Thread(target=process.wait, name=f"run-now-{job}-{process.pid}", daemon=True).start()
    return process.pid
