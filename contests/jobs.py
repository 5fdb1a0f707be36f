"""The contests app's jobs, as ``LOCKS_JOBS`` names them.

Each job receives its lease and returns the counts that go on its ``JobRun``; each
``preview_*`` is the job's dry run (no lease, no writes). ``locks.runner.run_job``
runs them (``run_job``, ``sync_contests``, ``send_reminders``, the trigger, the
scheduler).
"""

from __future__ import annotations

from contests.checks import check_reminder_headers
from contests.codeforces import CodeforcesClient
from contests.reminders import ReminderDeliveryError, deliver_due_reminders
from contests.services import sync_codeforces_contests
from locks import Lease


def sync_contests(lease: Lease) -> dict[str, int]:
    """Pull the Codeforces contest list."""
    return sync_codeforces_contests(client=CodeforcesClient(), lease=lease).as_dict()


def preview_sync() -> dict[str, int]:
    """What a sync would write now."""
    return sync_codeforces_contests(client=CodeforcesClient(), dry_run=True).as_dict()


class RemindersMisconfigured(ReminderDeliveryError):
    """What every reminder must carry is misconfigured (``contests.E009`` to ``E011``): nothing is
    claimed or sent, and no other job stops for it."""


def send_reminders(lease: Lease) -> dict[str, int]:
    """Email each due reminder once (each batch is claimed as well, so even runs that
    overlap, after a lease lost mid-run, never send one twice)."""
    refused = check_reminder_headers()
    if refused:
        said = "; ".join(
            f"({error.id}) {error.msg} HINT: {error.hint}" if error.hint else f"({error.id}) {error.msg}"
            for error in refused
        )
        raise RemindersMisconfigured(f"not sent: {said}")
    return deliver_due_reminders(lease=lease).as_dict()


def preview_reminders() -> dict[str, int]:
    """What a run would do now, claiming and sending nothing."""
    return deliver_due_reminders(dry_run=True).as_dict()
