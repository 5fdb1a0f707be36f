"""The locks app: each scheduled tick of each job runs exactly once, however many copies ask.

This package is the public API (docs/jobs.md, "The public API"): another app imports these
names from ``locks`` and nothing else; the modules inside may move. The names are imported on
first use, so a settings module can import ``cronjobs`` before Django is set up.

The module paths of the last release (``locks.claims``, ``locks.leases``, ...) still import,
with a ``DeprecationWarning``, until the next one (CHANGELOG.md).
"""

from __future__ import annotations

import importlib
import importlib.abc
import importlib.util
import sys
import warnings

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


# The modules of the last release, each now part of a room cut by responsibility.
_MOVED = {
    "claims": "lease",
    "leases": "lease",
    "bounds": "db",
    "text": "db",
    "results": "runner",
    "operations": "operator",
    "pausing": "operator",
    "run_now": "operator",
    "selectors": "status",
    "ledger": "status",
    "auth": "views",
    "throttle": "views",
    "metrics": "views",
    "display": "admin",
    "actions": "admin",
    "controls": "admin",
    "builtin": "registry",
    "alerts": "contrib.alerts.jobs",  # an app of its own now: INSTALLED_APPS names locks.contrib.alerts
}


class _MovedModules(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """``import locks.claims`` (and the other old paths) gives the module that holds those
    names now, with a ``DeprecationWarning`` naming the public import to use instead."""

    def find_spec(self, fullname, path=None, target=None):
        old = fullname.removeprefix("locks.")
        if fullname.startswith("locks.") and old in _MOVED:
            return importlib.util.spec_from_loader(fullname, self)
        return None

    def create_module(self, spec):
        old = spec.name.removeprefix("locks.")
        warnings.warn(
            f"{spec.name} is deprecated and goes in the next release: import the public names from "
            f"locks (e.g. `from locks import fenced, Lease`); it is locks.{_MOVED[old]} now",
            DeprecationWarning,
            stacklevel=2,
        )
        return importlib.import_module(f"locks.{_MOVED[old]}")

    def exec_module(self, module) -> None:
        """The module is the new one, already run."""


sys.meta_path.append(_MovedModules())
