"""The test host project's jobs: what a project of its own would register in LOCKS_JOBS."""

from __future__ import annotations

from locks.leases import fenced
from tests.jobsapp.models import SlotWrite


def write_slot(lease) -> dict:
    """One row for the slot, inside the fenced transaction (renewed on the token first)."""
    with fenced(lease):
        SlotWrite.objects.create(job=lease.job, tick=lease.tick, token=lease.token, holder=lease.holder)
    return {"written": 1}
