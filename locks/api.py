"""The public names of the lock, for ``from locks.api import …``.

Leases live in ``locks.leases``; running a job under one in ``locks.runner``.
"""

from locks.leases import (
    ForcedRelease,
    Lease,
    LockError,
    LockLost,
    Skip,
    TickReset,
    UnknownJob,
    acquire,
    fenced,
    force_release,
    make_holder,
    release,
    renew,
    reset_tick,
)
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
    "fenced",
    "force_release",
    "make_holder",
    "prune_runs",
    "release",
    "renew",
    "reset_tick",
    "run_locked",
]
