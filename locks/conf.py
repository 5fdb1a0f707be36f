"""The locks app's settings and their defaults, in the django-axes way: each default is
defined here, once, and applied to ``django.conf.settings`` when this module is imported
(``LocksConfig.ready``); the rest of the app reads ``settings.LOCKS_*`` plainly. A host
project sets only what it changes. What each one means: docs/jobs.md, Settings.
"""

from django.conf import settings

# The registered jobs: name -> {"schedule", "callable", ...} (docs/jobs.md).
settings.LOCKS_JOBS = getattr(settings, "LOCKS_JOBS", {})
# Seconds: a job's lease when its entry names no ttl.
settings.LOCKS_DEFAULT_TTL = getattr(settings, "LOCKS_DEFAULT_TTL", 300)
# Seconds: how early a run may claim the upcoming slot (at most a quarter of the gap).
settings.LOCKS_TICK_WINDOW = getattr(settings, "LOCKS_TICK_WINDOW", 300)
# Days of run history kept per job.
settings.LOCKS_RUN_RETENTION_DAYS = getattr(settings, "LOCKS_RUN_RETENTION_DAYS", 30)
# Seconds: a host clock further than this from the database's gets a WARNING.
settings.LOCKS_MAX_CLOCK_SKEW = getattr(settings, "LOCKS_MAX_CLOCK_SKEW", 120)
# Seconds a running job gets to finish after run_scheduler is told to stop.
settings.LOCKS_SCHEDULER_GRACE = getattr(settings, "LOCKS_SCHEDULER_GRACE", 30)
# run_scheduler's worker processes, which keep their connections between runs; 0: a process per run.
settings.LOCKS_SCHEDULER_WORKERS = getattr(settings, "LOCKS_SCHEDULER_WORKERS", 4)
# The HTTP trigger's bearer token; empty: the trigger answers 404.
settings.LOCKS_TRIGGER_TOKEN = getattr(settings, "LOCKS_TRIGGER_TOKEN", "")
# Seconds: one trigger request per job and client address per window.
settings.LOCKS_TRIGGER_RATE_WINDOW = getattr(settings, "LOCKS_TRIGGER_RATE_WINDOW", 10)
# The read-only token that shows holder host names and error texts on /healthz.
settings.LOCKS_HEALTHZ_TOKEN = getattr(settings, "LOCKS_HEALTHZ_TOKEN", "")
# A job whose fields /healthz also repeats at the top level of its answer; empty: none.
settings.LOCKS_HEALTHZ_JOB = getattr(settings, "LOCKS_HEALTHZ_JOB", "")
# Proxies in front of the app that append to X-Forwarded-For; 0: the TCP peer is the client.
settings.LOCKS_TRUSTED_PROXY_COUNT = getattr(settings, "LOCKS_TRUSTED_PROXY_COUNT", 0)
# The file `crontab_env` writes and the crontab line sources; None: crontab_env refuses.
settings.LOCKS_CRONTAB_ENV_FILE = getattr(settings, "LOCKS_CRONTAB_ENV_FILE", None)
# The environment variables a job reads, which `crontab_env` writes to that file: an explicit
# list (no prefixes), so web-only tokens and other tools' passwords stay out of it.
settings.LOCKS_CRONTAB_ENV_VARIABLES = getattr(
    settings,
    "LOCKS_CRONTAB_ENV_VARIABLES",
    (
        *("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "DJANGO_SECRET_KEY", "DJANGO_DEBUG"),
        *("LOCKS_DEFAULT_TTL", "LOCKS_TICK_WINDOW", "LOCKS_MAX_CLOCK_SKEW", "LOCKS_RUN_RETENTION_DAYS"),
    ),
)
# The jobs the app registers itself (locks.registry: check_jobs); False: none.
settings.LOCKS_CHECK_JOBS = getattr(settings, "LOCKS_CHECK_JOBS", True)
# How many recent slots of each job the tick ledger shows (locks ticks, the admin, /metrics);
# at most MAX_LEDGER_SLOTS (a check error beyond; `locks ticks --last` exits 2).
settings.LOCKS_LEDGER_SLOTS = getattr(settings, "LOCKS_LEDGER_SLOTS", 48)
MAX_LEDGER_SLOTS = 10_000
# The bearer token of GET /metrics; empty: /metrics answers 404.
settings.LOCKS_METRICS_TOKEN = getattr(settings, "LOCKS_METRICS_TOKEN", "")
# Dotted paths of functions that /metrics calls for more metric families (another app's own).
settings.LOCKS_METRICS_COLLECTORS = getattr(settings, "LOCKS_METRICS_COLLECTORS", ())
# Whether /healthz counts a paused job as unhealthy (503); False: it reports it as `paused` only.
settings.LOCKS_HEALTHZ_PAUSED_UNHEALTHY = getattr(settings, "LOCKS_HEALTHZ_PAUSED_UNHEALTHY", False)
