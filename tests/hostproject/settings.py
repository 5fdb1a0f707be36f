"""A project of its own that installs the locks app, as any Django project would: Django's
contrib apps, ``locks``, ``django_crontab`` (the ``crontab`` command cron is wired with)
and its own app, ``tests.jobsapp``. No ``contests``, no Codeforces, no axes. tests/locks
runs under it (``pytest --ds tests.hostproject.settings``, part of ``make test``).

Every ``LOCKS_*`` setting it leaves out keeps its default (locks/conf.py).
"""

import importlib.util
import os
import sys
from pathlib import Path

import environ

from locks import command_prefix, cronjobs
from locks.registry import BUILTIN_JOBS

ROOT = Path(__file__).resolve().parents[2]
VAR = Path(os.environ.get("HOSTPROJECT_VAR", ROOT / "var" / "hostproject"))  # its database, logs, cron env
VAR.mkdir(parents=True, exist_ok=True)

SECRET_KEY = "host-project-tests-only"
DEBUG = True
ALLOWED_HOSTS = ["localhost", "127.0.0.1", "testserver"]
USE_TZ = True
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

# django-tasks-db's ORM backend, with Django 6's django.tasks or the django-tasks backport (5.2),
# when installed (the extra [tasks]): the "slot_task" job below.
BACKPORT = [] if importlib.util.find_spec("django.tasks") else ["django_tasks"]
TASK_APPS = [*BACKPORT, "django_tasks_db"] if importlib.util.find_spec("django_tasks_db") else []
INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_crontab",
    "locks",
    *([] if os.environ.get("HOSTPROJECT_ALERTS") == "0" else ["locks.contrib.alerts"]),  # check_jobs
    "tests.jobsapp",
    *TASK_APPS,
]
MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
]
ROOT_URLCONF = "tests.hostproject.urls"
TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "APP_DIRS": True,
        "OPTIONS": {
            "context_processors": [
                "django.template.context_processors.request",
                "django.contrib.auth.context_processors.auth",
                "django.contrib.messages.context_processors.messages",
            ],
        },
    },
]
STATIC_URL = "static/"

# DATABASE_URL (django-environ): PostgreSQL under scripts/with-postgres.sh, else an SQLite file.
DATABASES = {
    "default": environ.Env.db_url_config(os.environ.get("DATABASE_URL") or f"sqlite:///{VAR}/db.sqlite3")
}
if DATABASES["default"]["ENGINE"] == "django.db.backends.sqlite3":
    # Several processes share the file: WAL, a busy timeout, and BEGIN IMMEDIATE so that two
    # writers queue instead of deadlocking on a read-to-write upgrade (docs/jobs.md).
    timeout = float(DATABASES["default"].get("OPTIONS", {}).get("timeout", 30))  # ?timeout=S in the URL
    DATABASES["default"]["OPTIONS"] = {
        "transaction_mode": "IMMEDIATE",
        "timeout": timeout,
        "init_command": f"PRAGMA journal_mode=WAL;PRAGMA busy_timeout={round(timeout * 1000)};",
    }
    DATABASES["default"]["TEST"] = {"NAME": str(VAR / "test_db.sqlite3")}
else:
    DATABASES["default"]["OPTIONS"] = {"connect_timeout": 5}

# The lock's lines on stderr, one per run (docs/jobs.md, "Settings").
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {"plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"}},
    "handlers": {"stderr": {"class": "logging.StreamHandler", "stream": sys.stderr, "formatter": "plain"}},
    "root": {"handlers": ["stderr"], "level": "WARNING"},
    "loggers": {"locks": {"level": os.environ.get("LOCKS_LOG_LEVEL", "INFO")}},
}

# --- the project's jobs (tests/jobsapp/jobs.py) --------------------------------------
RECORD = {
    "schedule": "*/5 * * * *",
    "callable": "tests.jobsapp.jobs.record",
    "ttl": 60,
    "max_run_time": 120,
    "retry": {"delays": [30, 60]},
    "dry_run": "tests.jobsapp.jobs.preview",
}
_JOBS = {
    # Writes one SlotWrite row per run, under the fencing token.
    "write_slot": {
        "schedule": os.environ.get("WRITE_SLOT_SCHEDULE", "*/5 * * * *"),
        "callable": "tests.jobsapp.jobs.write_slot",
        "ttl": 60,
    },
    "record": RECORD,
    "refuse": {
        **RECORD,
        "schedule": os.environ.get("REFUSE_SCHEDULE", RECORD["schedule"]),
        "ttl": int(os.environ.get("REFUSE_TTL", RECORD["ttl"])),
        "callable": "tests.jobsapp.jobs.refuse",
        "retry": {"delays": [int(s) for s in os.environ.get("REFUSE_RETRY", "30,60").split(",")]},
        "expected_errors": ["tests.jobsapp.jobs.Refused"],
    },
    "linger": {"schedule": "*/5 * * * *", "callable": "tests.jobsapp.jobs.linger", "ttl": 60},
    # A write that takes a while, on the schedule and with the TTL a test picks (seconds).
    "slow_write": {
        "schedule": os.environ.get("SLOW_WRITE_SCHEDULE", "*/5 * * * *"),
        "callable": "tests.jobsapp.jobs.slow_write",
        "ttl": int(os.environ.get("SLOW_WRITE_TTL", "60")),
        "retry": {"delays": [int(s) for s in os.environ.get("SLOW_WRITE_RETRY", "").split(",") if s]},
    },
}
# Jobs only the processes of tests/locks/test_run_now.py and test_alerts.py register (by their variables).
if os.environ.get("RELEASE_FILE"):
    _JOBS["wait_for_release"] = {
        "schedule": "0 0 1 1 *",
        "callable": "tests.jobsapp.jobs.wait_for_release",
    }
if os.environ.get("FLAKY_FILE"):
    _JOBS["flaky"] = {
        "schedule": os.environ.get("FLAKY_SCHEDULE", "*/5 * * * *"),
        "callable": "tests.jobsapp.jobs.flaky",
        "ttl": 10,
        "expected_errors": ["tests.jobsapp.jobs.Refused"],
        "alert_after_failures": 2,
    }
if os.environ.get("CHECK_JOBS_SCHEDULE"):  # the app's own check_jobs, more often than every minute
    _JOBS["check_jobs"] = {**BUILTIN_JOBS["check_jobs"], "schedule": os.environ["CHECK_JOBS_SCHEDULE"]}
if os.environ.get(
    "BERLIN_JOBS"
):  # the DST nights of tests/locks/test_dst_processes.py, read in Europe/Berlin
    _JOBS["nightly"] = {
        "schedule": "30 2 * * *",
        "timezone": "Europe/Berlin",
        "callable": "tests.jobsapp.jobs.write_slot",
        "ttl": 60,
    }
    _JOBS["hourly"] = {
        "schedule": "0 * * * *",
        "timezone": "Europe/Berlin",
        "callable": "tests.jobsapp.jobs.write_slot",
        "ttl": 60,
    }
# django.tasks (Django 6) or its backport django-tasks (5.2), with django-tasks-db's ORM backend,
# when installed (the extra [tasks]); the processes of tests/locks/test_task_processes.py register
# "slot_task", a job that enqueues tests.jobsapp.tasks.record_slot once a slot (docs/jobs.md).
if TASK_APPS:
    # TASK_DIE: a run_job process that dies around its enqueue (tests.jobsapp.backends);
    # OUTSIDE_TASKS: a backend outside the database, its tasks sent through the outbox.
    backend = (
        "tests.jobsapp.backends.OutsideBackend"
        if os.environ.get("OUTSIDE_TASKS")
        else "tests.jobsapp.backends.DyingBackend"
        if os.environ.get("TASK_DIE")
        else "django_tasks_db.DatabaseBackend"
    )
    TASKS = {"default": {"BACKEND": backend}}
SLOT_TASK = {
    "schedule": os.environ.get("SLOT_TASK_SCHEDULE", "*/5 * * * *"),
    "task": "tests.jobsapp.tasks.record_slot",
    "ttl": int(os.environ.get("SLOT_TASK_TTL", "60")),
    "max_run_time": int(os.environ.get("SLOT_TASK_WAIT", "120")),  # then the slot is unknown
    "retry": {"delays": [int(s) for s in os.environ.get("SLOT_TASK_RETRY", "1,1").split(",")]},
}
if os.environ.get("SLOT_TASK_SCHEDULE"):
    _JOBS["slot_task"] = SLOT_TASK
if os.environ.get("SLOT_TASK_SCHEDULE") and os.environ.get("OUTSIDE_TASKS"):
    # "outbox_task": the same behind locks.once, on a backend outside the database (docs/jobs.md).
    _JOBS["outbox_task"] = {**SLOT_TASK, "task": "tests.jobsapp.tasks.record_once"}
# HOSTPROJECT_JOBS="a b": only those (a test's processes that must not watch the others).
_ONLY = os.environ.get("HOSTPROJECT_JOBS", "").split()
LOCKS_JOBS = {name: entry for name, entry in _JOBS.items() if not _ONLY or name in _ONLY}
# /healthz repeats its fields at the top level; not named when HOSTPROJECT_JOBS leaves it out (locks.W008).
LOCKS_HEALTHZ_JOB = "write_slot" if "write_slot" in LOCKS_JOBS else ""
# The processes a test starts may set these; left out, each keeps its default.
if os.environ.get("LOCKS_SCHEDULER_GRACE"):
    LOCKS_SCHEDULER_GRACE = int(os.environ["LOCKS_SCHEDULER_GRACE"])
if os.environ.get("LOCKS_SCHEDULER_WORKERS"):
    LOCKS_SCHEDULER_WORKERS = int(os.environ["LOCKS_SCHEDULER_WORKERS"])
if os.environ.get("LOCKS_TRIGGER_TOKEN"):
    LOCKS_TRIGGER_TOKEN = os.environ["LOCKS_TRIGGER_TOKEN"]
if os.environ.get("LOCKS_HEALTHZ_TOKEN"):
    LOCKS_HEALTHZ_TOKEN = os.environ["LOCKS_HEALTHZ_TOKEN"]
# check_jobs' emails (mail_admins), to files a test reads (Django's file-based backend).
ADMINS = [("On call", "oncall@example.com")]
EMAIL_BACKEND = f"django.core.mail.backends.{'filebased' if os.environ.get('HOSTPROJECT_MAIL_DIR') else 'locmem'}.EmailBackend"
EMAIL_FILE_PATH = os.environ.get("HOSTPROJECT_MAIL_DIR", str(VAR / "mail"))

# --- cron: one line per job, which sources the file `crontab_env` writes ----------------
# HOSTPROJECT_CHECK_JOBS=0: without the app's own check_jobs (LOCKS_CHECK_JOBS), for a test's cron passes.
LOCKS_CHECK_JOBS = os.environ.get("HOSTPROJECT_CHECK_JOBS", "1") == "1"
CRONJOBS = cronjobs(LOCKS_JOBS, log_dir=VAR / "log", check_jobs=LOCKS_CHECK_JOBS)
CRONTAB_PYTHON_EXECUTABLE = sys.executable
CRONTAB_DJANGO_MANAGE_PATH = str(Path(__file__).with_name("manage.py"))
CRONTAB_DJANGO_PROJECT_NAME = "hostproject"  # the lines it adds and removes say so
LOCKS_CRONTAB_ENV_FILE = VAR / "crontab.env"
LOCKS_CRONTAB_ENV_VARIABLES = (
    "DATABASE_URL",
    "DJANGO_SETTINGS_MODULE",
    "HOSTPROJECT_VAR",
    "HOSTPROJECT_JOBS",
    "HOSTPROJECT_CHECK_JOBS",
    "BERLIN_JOBS",
)  # what its jobs read (and which of them a test registers)
CRONTAB_COMMAND_PREFIX = command_prefix(LOCKS_CRONTAB_ENV_FILE)
# A test edits a throwaway user's crontab, never the caller's (tests/locks/test_crontab.py).
if os.environ.get("HOSTPROJECT_CRONTAB_USER"):
    CRONTAB_EXECUTABLE = f"/usr/bin/crontab -u {os.environ['HOSTPROJECT_CRONTAB_USER']}"
