"""The public names of the lock, for ``from locks.api import …``.

Leases live in ``locks.leases``; running a job under one in ``locks.runner``; the
operator's force release and tick reset in ``locks.operations``.
"""

from locks.leases import (
    Lease,
    LockError,
    LockLost,
    Skip,
    UnknownJob,
    acquire,
    error_text,
    fenced,
    make_holder,
    release,
    renew,
)
from locks.operations import ForcedRelease, TickReset, force_release, reset_tick
from locks.runner import RunResult, prune_runs, run_locked

__all__ = [
    "ForcedRelease",
    "Lease",
    "LockError",
    "LockLost",
    "RunResult",
    "Skip",
    "TickReset",
    "UnknownJob",
    "acquire",
    "error_text",
    "fenced",
    "force_release",
    "make_holder",
    "prune_runs",
    "release",
    "renew",
    "reset_tick",
    "run_locked",
]
