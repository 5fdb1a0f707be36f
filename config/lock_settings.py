"""The locks app's settings from the environment (docs/deployment.md, "Configuration").

Only the variables that are set become settings: the others keep the defaults of
locks/conf.py, defined there once. Four were renamed so that each says what it guards
(``LOCKS_`` like every setting of the app); the old names still work for this release,
with a ``FutureWarning`` on stderr, and may not disagree with the new ones.
"""

from __future__ import annotations

import warnings

from django.core.exceptions import ImproperlyConfigured

from config.env import Env

CASTS = {
    "LOCKS_DEFAULT_TTL": int,
    "LOCKS_RUN_RETENTION_DAYS": int,
    "LOCKS_MAX_CLOCK_SKEW": int,
    "LOCKS_TICK_WINDOW": int,
    "LOCKS_SCHEDULER_GRACE": int,
    "LOCKS_SCHEDULER_WORKERS": int,
    "LOCKS_TRIGGER_TOKEN": str,
    "LOCKS_TRIGGER_RATE_WINDOW": int,
    "LOCKS_HEALTHZ_TOKEN": str,
    "LOCKS_TRUSTED_PROXY_COUNT": int,
    "LOCKS_METRICS_TOKEN": str,
    "LOCKS_LEDGER_SLOTS": int,
}
OLD_NAMES = {
    "LOCKS_TRIGGER_TOKEN": "SYNC_TRIGGER_TOKEN",
    "LOCKS_TRIGGER_RATE_WINDOW": "SYNC_TRIGGER_RATE_WINDOW",
    "LOCKS_HEALTHZ_TOKEN": "HEALTHZ_TOKEN",
    "LOCKS_TRUSTED_PROXY_COUNT": "DJANGO_TRUSTED_PROXY_COUNT",
}
DEPRECATED = "{old} is deprecated: rename it {new} (the old name stops working in the next release)"
DISAGREE = "{old} and {new} are set to different values: {old} is the old name of {new}; unset {old}"


def lock_settings(env: Env) -> dict:
    """``LOCKS_*`` name to value, for each variable (or its old name) that is set."""
    found = {}
    for name, cast in CASTS.items():
        source, old = name, OLD_NAMES.get(name)
        if old and env.ENVIRON.get(old, ""):
            if env.ENVIRON.get(name, "") not in ("", env.ENVIRON[old]):
                raise ImproperlyConfigured(DISAGREE.format(old=old, new=name))
            warnings.warn(DEPRECATED.format(old=old, new=name), FutureWarning, stacklevel=2)
            source = old
        if env.ENVIRON.get(source, ""):
            found[name] = env.get_value(source, cast=cast)
    return found
