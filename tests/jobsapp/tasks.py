"""The host project's django.tasks task: its job "slot_task" enqueues it once a slot (docs/jobs.md,
"Periodic tasks"). Importable without the tasks package: the tests that use it skip then."""

from __future__ import annotations

import os
import time
from pathlib import Path

from locks import once
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
    (removing the file, so a later attempt succeeds); takes TASK_SECONDS (default 0). The first
    delivery for the slot TASK_HANG_SLOT writes its pid to TASK_HANG_FILE and never ends."""
    return _record(slot=slot, token=token, job="slot_task")


def _record(*, slot: str | None, token: int, job: str) -> dict:
    time.sleep(float(os.environ.get("TASK_SECONDS", "0")))
    if (
        slot is not None
        and slot == os.environ.get("TASK_HANG_SLOT")
        and _first_here(os.environ["TASK_HANG_FILE"])
    ):
        while True:  # inside its slot's transaction until the test kills this process
            time.sleep(0.1)
    fail = Path(os.environ.get("TASK_FAIL_FILE", "/nonexistent"))
    if fail.exists():
        fail.unlink()
        raise ValueError(f"refused slot {slot}")
    SlotWrite.objects.create(job=job, tick=slot, token=token, holder=f"worker:{os.getpid()}")
    return {"slot": slot}


def _first_here(path: str) -> bool:
    """True for the first process to get here (TASK_HANG_FILE, created with its pid), False after."""
    try:
        fd = os.open(path, os.O_CREAT | os.O_EXCL | os.O_WRONLY)
    except FileExistsError:
        return False
    os.write(fd, f"{os.getpid()}\n".encode())
    os.close(fd)
    return True


def record_once(*, slot: str | None, token: int) -> dict:
    """record_slot for the job "outbox_task", sent through the outbox: at most once a slot (locks.once)."""
    return _record(slot=slot, token=token, job="outbox_task")


if task is not None:
    record_once = task(once("outbox_task")(record_once))
    record_slot = task(record_slot)
