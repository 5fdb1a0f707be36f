"""The contests app's jobs, as ``LOCKS_JOBS`` names them: each receives its lease."""

from __future__ import annotations

from contests.codeforces import CodeforcesClient
from contests.services import sync_codeforces_contests
from locks.api import Lease


def sync_contests(lease: Lease) -> dict[str, int]:
    """Pull the Codeforces contest list; the counts go on the ``JobRun``."""
    return sync_codeforces_contests(client=CodeforcesClient(), lease=lease).as_dict()
