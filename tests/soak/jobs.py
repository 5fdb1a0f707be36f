"""The soak's job: ``tests.jobsapp``'s one ``SlotWrite`` row per slot, inside ``fenced()``,
with the time a real job takes around it, so that faults land in the middle of runs."""

from __future__ import annotations

import time

from locks.lease import fenced
from tests.jobsapp.models import SlotWrite
from tests.soak import timing


def write_slot_slowly(lease) -> dict:
    time.sleep(timing.WORK_SECONDS)  # the work before the write (a fetch, say)
    with fenced(lease):
        SlotWrite.objects.create(job=lease.job, tick=lease.tick, token=lease.token, holder=lease.holder)
        # A write that takes a while: the lock row stays locked by this transaction meanwhile.
        time.sleep(timing.WRITE_SECONDS)
    return {"written": 1}
