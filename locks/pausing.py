"""Pause and resume a job, cluster-wide: one conditional UPDATE on its ``SyncLock`` row (created
if the job never ran) and one ``JobPause`` row of history, in one transaction. Acquire's
compare-and-set refuses every contender while ``paused_at`` is set, so cron, ``run_scheduler``,
``run_job`` (``--force`` too) and the trigger obey it at once; a run already holding the lease
finishes (docs/architecture.md, "Operating the jobs"). Each pause and resume is a WARNING line;
the admin's actions add a ``LogEntry`` (``locks.controls``).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.db import IntegrityError, router, transaction
from django.db.models.functions import Now

from locks.claims import iso
from locks.models import PAUSE_FIELDS, JobPause, SyncLock
from locks.registry import get_job
from locks.text import safe_text

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
