"""The locks app: each scheduled tick of each job runs exactly once, however many copies ask.

This package is the public API (docs/jobs.md, "The public API"): its names are imported on first
use, so a settings module can import ``cronjobs`` before Django is set up.
"""

from __future__ import annotations

import importlib

# name -> the module that defines it
_API = {
    **dict.fromkeys(("Lease", "Skip", "LockLost", "LockError", "CommitUnknown", "NotCommitted"), "lease"),
    **dict.fromkeys(("acquire", "renew", "fenced", "release", "make_holder", "ClaimRules", "Grant"), "lease"),
    **dict.fromkeys(("run_locked", "run_job", "RunResult", "Failure"), "runner"),
    **dict.fromkeys(("Outcome", "database_now", "now_plus"), "models"),
    **dict.fromkeys(("cronjobs", "command_prefix"), "crontab"),
    **dict.fromkeys(("ReadOnlyAdminMixin", "badge"), "admin"),
    "once": "tasks",
    "CHECK_TAG": "checks",
    "RunJobCommand": "management.commands.run_job",
}
__all__ = sorted(_API)


def __getattr__(name: str):
    if name not in _API:
        raise AttributeError(f"module 'locks' has no attribute {name!r}")
    value = getattr(importlib.import_module(f"locks.{_API[name]}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
