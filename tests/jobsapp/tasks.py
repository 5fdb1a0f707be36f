"""The host project's django.tasks task: its job "slot_task" enqueues it once a slot (docs/jobs.md,
"Periodic tasks"). Importable without the tasks package: the tests that use it skip then."""

from __future__ import annotations

import os
import time
from pathlib import Path

from tests.jobsapp.models import SlotWrite

try:
    from django.tasks import task
except ImportError:
    try:
        from django_tasks import task
    except ImportError:  # neither Django 6 nor the backport: no task here
        task = None


def record_slot(*, slot: str | None, token: int) -> dict:
    """One SlotWrite row for the slot, written by the worker. Fails while TASK_FAIL_FILE exists
    (removing the file, so a later attempt succeeds); takes TASK_SECONDS (default 0)."""
    time.sleep(float(os.environ.get("TASK_SECONDS", "0")))
    fail = Path(os.environ.get("TASK_FAIL_FILE", "/nonexistent"))
    if fail.exists():
        fail.unlink()
        raise ValueError(f"refused slot {slot}")
    SlotWrite.objects.create(job="slot_task", tick=slot, token=token, holder=f"worker:{os.getpid()}")
    return {"slot": slot}


if task is not None:
    record_slot = task(record_slot)
