"""The locks app: each scheduled tick of each job runs exactly once, however many copies ask.

This package is the public API (docs/jobs.md, "The public API"): its names are imported on first
use, so a settings module can import ``cronjobs`` before Django is set up.
"""

from __future__ import annotations

import importlib

# name -> the module that defines it
_API = {
    "Lease": "lease",
    "Skip": "lease",
    "LockLost": "lease",
    "LockError": "lease",
    "CommitUnknown": "lease",
    "NotCommitted": "lease",
    "acquire": "lease",
    "renew": "lease",
    "fenced": "lease",
    "once": "tasks",
    "release": "lease",
    "run_locked": "runner",
    "run_job": "runner",
    "RunResult": "runner",
    "Outcome": "models",
    "database_now": "models",
    "now_plus": "models",
    "make_holder": "lease",
    "CHECK_TAG": "checks",
    "cronjobs": "crontab",
    "command_prefix": "crontab",
    "RunJobCommand": "management.commands.run_job",
    "ReadOnlyAdminMixin": "admin",
    "badge": "admin",
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
