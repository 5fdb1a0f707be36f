"""The ``LOCKS_*`` settings' defaults, applied to ``django.conf.settings`` on import (``LocksConfig.ready``):
the app reads ``settings.LOCKS_*`` plainly. What each one means: docs/jobs.md, Settings."""

from django.conf import settings

MAX_LEDGER_SLOTS = 10_000  # the most LOCKS_LEDGER_SLOTS may be (a check error beyond)
DEFAULTS = {
    "LOCKS_JOBS": {},
    "LOCKS_DEFAULT_TTL": 300,  # seconds
    "LOCKS_TICK_WINDOW": 300,  # seconds
    "LOCKS_RUN_RETENTION_DAYS": 30,
    "LOCKS_MAX_CLOCK_SKEW": 120,  # seconds
    "LOCKS_SCHEDULER_GRACE": 30,  # seconds
    "LOCKS_SCHEDULER_WORKERS": 4,  # 0: a process per run
    "LOCKS_TRIGGER_TOKEN": "",  # empty: the trigger answers 404
    "LOCKS_TRIGGER_RATE_WINDOW": 10,  # seconds
    "LOCKS_HEALTHZ_TOKEN": "",
    "LOCKS_HEALTHZ_JOB": "",
    "LOCKS_TRUSTED_PROXY_COUNT": 0,
    "LOCKS_CRONTAB_ENV_FILE": None,  # None: crontab_env refuses
    # An explicit list (no prefixes), so web-only tokens and other tools' passwords stay out of it.
    "LOCKS_CRONTAB_ENV_VARIABLES": (
        *("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "DJANGO_SECRET_KEY", "DJANGO_DEBUG"),
        *("LOCKS_DEFAULT_TTL", "LOCKS_TICK_WINDOW", "LOCKS_MAX_CLOCK_SKEW", "LOCKS_RUN_RETENTION_DAYS"),
    ),
    "LOCKS_CHECK_JOBS": True,
    "LOCKS_LEDGER_SLOTS": 48,
    "LOCKS_METRICS_TOKEN": "",  # empty: /metrics answers 404
    "LOCKS_METRICS_COLLECTORS": (),
    "LOCKS_HEALTHZ_PAUSED_UNHEALTHY": False,
}
for name, default in DEFAULTS.items():
    setattr(settings, name, getattr(settings, name, default))
