"""Settings of a soak's replicas (``DJANGO_SETTINGS_MODULE=tests.soak.settings``): the
project's own, with ``tests.jobsapp`` installed and the soak job registered beside the
project's jobs. ``SOAK_CATCH_UP`` (``--catch-up``) puts a ``catch_up`` key into the job's
entry."""

from config.settings import *  # noqa: F403
from config.settings import BASE_DIR, INSTALLED_APPS, LOCKS_JOBS, MIGRATION_MODULES, MONGODB, env
from locks.crontab import cronjobs
from tests.soak import timing

if MONGODB:  # --db mongodb
    INSTALLED_APPS = [*INSTALLED_APPS, "tests.jobsapp.apps.MongoJobsAppConfig"]
    MIGRATION_MODULES = {**MIGRATION_MODULES, "jobsapp": None}
else:
    INSTALLED_APPS = [*INSTALLED_APPS, "tests.jobsapp"]

LOCKS_SCHEDULER_GRACE = timing.GRACE
SOAK_JOB = {
    "schedule": timing.SCHEDULE,
    "callable": "tests.soak.jobs.write_slot_slowly",
    "ttl": timing.TTL,
    "max_run_time": timing.MAX_RUN_TIME,
    "retry": {"delays": timing.RETRY_DELAYS},
}
if catch_up := env.str("SOAK_CATCH_UP", ""):
    SOAK_JOB["catch_up"] = catch_up
LOCKS_JOBS = {**LOCKS_JOBS, timing.JOB: SOAK_JOB}
CRONJOBS = cronjobs(LOCKS_JOBS, log_dir=BASE_DIR / "var")
