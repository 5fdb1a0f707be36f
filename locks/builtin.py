"""The jobs the locks app registers itself, beside a project's ``LOCKS_JOBS``: ``check_jobs``
(``locks.alerts``), which watches every other job and emails ``ADMINS`` once per incident.
Off with ``LOCKS_CHECK_JOBS = False``; a ``LOCKS_JOBS`` entry of the same name replaces it.
Imports nothing from Django: the settings module reads it (``locks.crontab.cronjobs``).
"""

from __future__ import annotations

BUILTIN_JOBS = {
    "check_jobs": {
        "schedule": "* * * * *",
        "callable": "locks.alerts.check_jobs",
        "ttl": 120,
        "max_run_time": 300,
        "expected_errors": ["locks.alerts.AlertNotSent"],
    }
}


def with_builtin_jobs(jobs, *, enabled: bool = True):
    """``jobs`` (a ``LOCKS_JOBS`` value) with the app's own jobs added unless ``enabled`` is
    false or ``jobs`` names them itself; anything but a dict is returned as it is (the checks
    refuse it)."""
    if not enabled or not isinstance(jobs, dict):
        return jobs
    return {**jobs, **{name: entry for name, entry in BUILTIN_JOBS.items() if name not in jobs}}
