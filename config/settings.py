"""Settings, all driven by the environment (the full list: docs/deployment.md, "Configuration").

Every variable is read through ``config.env.Env`` (django-environ): a value
that does not parse stops start-up with one line that names it.
"""

import sys
from datetime import timedelta
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from config.database import (
    MONGODB_APP_CONFIGS,
    MONGODB_AUTO_FIELD,
    MONGODB_MIGRATION_MODULES,
    database_from_url,
    is_mongodb,
)
from config.env import Env, check_userinfo, log_level
from config.lock_settings import lock_settings
from locks import command_prefix, cronjobs

BASE_DIR = Path(__file__).resolve().parent.parent
env = Env()

DEBUG = env.bool("DJANGO_DEBUG", False)

SECRET_KEY = env.str("DJANGO_SECRET_KEY", "django-insecure-development-only-key" if DEBUG else "")
if not SECRET_KEY:
    raise ImproperlyConfigured(
        "DJANGO_SECRET_KEY is not set. Set it to a long random string, "
        "or set DJANGO_DEBUG=1 for local development."
    )

ALLOWED_HOSTS = env.list("DJANGO_ALLOWED_HOSTS", default=["localhost", "127.0.0.1", "[::1]"] if DEBUG else [])

DATABASES = {"default": database_from_url(env.str("DATABASE_URL", "sqlite:///db.sqlite3"), base_dir=BASE_DIR)}
# MongoDB (docs/mongodb.md), only when DATABASE_URL is mongodb:// or mongodb+srv://: ObjectId
# primary keys, contrib AppConfigs that do not pin AutoField, and the migrations in
# mongo_migrations/. SQLite and PostgreSQL keep the apps' own migrations.
MONGODB = is_mongodb(DATABASES["default"])
DEFAULT_AUTO_FIELD = MONGODB_AUTO_FIELD if MONGODB else "django.db.models.BigAutoField"
MIGRATION_MODULES = MONGODB_MIGRATION_MODULES if MONGODB else {}

INSTALLED_APPS = [
    MONGODB_APP_CONFIGS.get(app, app) if MONGODB else app
    for app in (
        "django.contrib.admin",
        "config.accounts",  # before django.contrib.auth: its createsuperuser applies the validators
        "django.contrib.auth",
        "django.contrib.contenttypes",
        "django.contrib.sessions",
        "django.contrib.messages",
        "django.contrib.staticfiles",
        "django_crontab",
        "locks",  # the job lock, trigger, /healthz, cron wiring (its defaults: locks/conf.py)
        "locks.contrib.alerts",  # check_jobs and its incidents, emailed to ADMINS
        "contests",
        "axes",  # admin login lockouts (Admin login block below)
    )
]

MIDDLEWARE = [
    "django.middleware.security.SecurityMiddleware",
    "whitenoise.middleware.WhiteNoiseMiddleware",
    "django.contrib.sessions.middleware.SessionMiddleware",
    "django.middleware.common.CommonMiddleware",
    "django.middleware.csrf.CsrfViewMiddleware",
    "django.contrib.auth.middleware.AuthenticationMiddleware",
    "django.contrib.messages.middleware.MessageMiddleware",
    "django.middleware.clickjacking.XFrameOptionsMiddleware",
    "axes.middleware.AxesMiddleware",  # last: turns a lockout into its 429 answer
]

ROOT_URLCONF = "config.urls"
WSGI_APPLICATION = "config.wsgi.application"

TEMPLATES = [
    {
        "BACKEND": "django.template.backends.django.DjangoTemplates",
        "DIRS": [],
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

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = Path(env.str("DJANGO_STATIC_ROOT", str(BASE_DIR / "staticfiles")))
STORAGES = {
    "default": {"BACKEND": "django.core.files.storage.FileSystemStorage"},
    "staticfiles": {"BACKEND": "whitenoise.storage.CompressedStaticFilesStorage"},
}

LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "formatters": {
        "plain": {"format": "%(asctime)s %(levelname)s %(name)s %(message)s"},
    },
    "handlers": {
        "stderr": {"class": "logging.StreamHandler", "stream": sys.stderr, "formatter": "plain"},
    },
    "root": {"handlers": ["stderr"], "level": "WARNING"},
    "loggers": {
        "locks": {"level": env("LOCKS_LOG_LEVEL", cast=log_level, default="INFO")},
        "contests": {"level": env("CONTESTS_LOG_LEVEL", cast=log_level, default="INFO")},
    },
}

# --- The lock (locks app) -------------------------------------------------
# Each LOCKS_* variable that is set, under its name; the rest keep locks/conf.py's defaults.
globals().update(lock_settings(env))
LOCKS_HEALTHZ_JOB = "sync_contests"  # /healthz repeats its fields at the top level, as it always did
LOCKS_METRICS_COLLECTORS = ["contests.metrics.reminder_metrics"]  # contests_reminders{state} on /metrics

# --- The sync (contests app) ----------------------------------------------
CODEFORCES_API_URL = env.str("CODEFORCES_API_URL", "https://codeforces.com/api")
check_userinfo("CODEFORCES_API_URL", CODEFORCES_API_URL)  # a mirror's password may be in it
# (connect, read) seconds per request.
CODEFORCES_TIMEOUT = (
    env.float("CODEFORCES_CONNECT_TIMEOUT", 5.0),
    env.float("CODEFORCES_READ_TIMEOUT", 30.0),
)
CODEFORCES_TOTAL_TIMEOUT = env.float("CODEFORCES_TOTAL_TIMEOUT", 120.0)
CODEFORCES_MAX_ATTEMPTS = env.int("CODEFORCES_MAX_ATTEMPTS", 3)
# Codeforces allows about one call per two seconds.
CODEFORCES_BACKOFF = env.float("CODEFORCES_BACKOFF", 2.0)
CODEFORCES_MAX_BYTES = env.int("CODEFORCES_MAX_BYTES", 20 * 1024 * 1024)

# --- Reminders: the send_reminders job (contests app; docs/reminders.md) --------
# A crash between sending and recording means at most one resend, this long later.
SEND_REMINDERS_CLAIM_TTL = env.int("SEND_REMINDERS_CLAIM_TTL", 600)
SEND_REMINDERS_MAX_ATTEMPTS = env.int("SEND_REMINDERS_MAX_ATTEMPTS", 5)
# Due reminders one UPDATE claims at a time, and SMTP connections per run (threads, when more
# than one, each fed the messages the run builds; none opened while nothing is due).
SEND_REMINDERS_BATCH = env.int("SEND_REMINDERS_BATCH", 500)
SEND_REMINDERS_CONNECTIONS = env.int("SEND_REMINDERS_CONNECTIONS", 1)
# Each reminder's Message-ID is <reminder-PK@this domain> on every send; empty: the host's own
# name (Django's DNS_NAME). Set it, the same on every host, when several hosts send.
SEND_REMINDERS_MESSAGE_ID_DOMAIN = env.str("SEND_REMINDERS_MESSAGE_ID_DOMAIN", "")
# Where the site is served (scheme, host, any path prefix): each reminder's one-click unsubscribe
# link points there. https:// in production (contests.E010).
SITE_URL = env.str("SITE_URL", "http://localhost:8000" if DEBUG else "")
# An address that takes unsubscribe requests by email too (List-Unsubscribe's mailto:); empty: none.
SEND_REMINDERS_UNSUBSCRIBE_MAILTO = env.str("SEND_REMINDERS_UNSUBSCRIBE_MAILTO", "")

# --- Email (the reminders' delivery; docs/reminders.md) -----------------------
# EMAIL_URL names the backend and its server; EMAIL_BACKEND and EMAIL_FILE_PATH override it.
_email = env.email_url("EMAIL_URL", default="consolemail://" if DEBUG else "smtp://localhost:25")
EMAIL_BACKEND = env.str("EMAIL_BACKEND", _email["EMAIL_BACKEND"])
EMAIL_HOST = _email["EMAIL_HOST"] or "localhost"
EMAIL_PORT = _email["EMAIL_PORT"] or 25
EMAIL_HOST_USER = _email["EMAIL_HOST_USER"] or ""
EMAIL_HOST_PASSWORD = _email["EMAIL_HOST_PASSWORD"] or ""
EMAIL_USE_TLS = _email.get("EMAIL_USE_TLS", False)
EMAIL_USE_SSL = _email.get("EMAIL_USE_SSL", False)
EMAIL_FILE_PATH = env.str("EMAIL_FILE_PATH", _email["EMAIL_FILE_PATH"] or str(BASE_DIR / "var" / "mail"))
# Seconds per SMTP operation; Django's default (none) would let a hung server hold a run.
EMAIL_TIMEOUT = env.int("EMAIL_TIMEOUT", 10)
DEFAULT_FROM_EMAIL = env.str("DEFAULT_FROM_EMAIL", "reminders@localhost")
# Who check_jobs emails (mail_admins) when a job needs attention, and from which address.
ADMINS = [("", address) for address in env.list("DJANGO_ADMINS", default=[])]
SERVER_EMAIL = env.str("DJANGO_SERVER_EMAIL", "locks@localhost")

# --- Jobs (locks app; docs/jobs.md): the one list of jobs every part of the project reads.
# Each job's schedule (cron, UTC), lease TTL and maximum run time (seconds) come from its
# own variables, read here and nowhere else.
LOCKS_JOBS = {
    "sync_contests": {
        "schedule": env.str("SYNC_CONTESTS_SCHEDULE", "0 * * * *"),
        "callable": "contests.jobs.sync_contests",
        "ttl": env.int("SYNC_CONTESTS_LOCK_TTL", 600),
        "max_run_time": env.int("SYNC_CONTESTS_MAX_RUN_TIME", 1800),
        # A failed tick is tried again after 1, 5 and 15 minutes (by run_scheduler).
        "retry": {"delays": [60, 300, 900]},
        "expected_errors": ["contests.codeforces.CodeforcesError"],
        "dry_run": "contests.jobs.preview_sync",
    },
    "send_reminders": {
        "schedule": env.str("SEND_REMINDERS_SCHEDULE", "* * * * *"),
        "callable": "contests.jobs.send_reminders",
        "ttl": env.int("SEND_REMINDERS_LOCK_TTL", 120),
        "max_run_time": env.int("SEND_REMINDERS_MAX_RUN_TIME", 600),
        # A failed minute is tried again once, 20 s later (by run_scheduler).
        "retry": {"delays": [20]},
        "expected_errors": ["contests.reminders.ReminderDeliveryError"],
        "dry_run": "contests.jobs.preview_reminders",
        # An email sent on a primary that then died may be sent again after a failover (its claim
        # and record lost with it): the job pauses instead, for an operator to decide.
        "on_failover": "pause",
    },
}

# check_jobs, the locks app's own job (locks/builtin.py), watches the others and emails ADMINS.
LOCKS_CHECK_JOBS = env.bool("LOCKS_CHECK_JOBS", True)
CRONJOBS = cronjobs(LOCKS_JOBS, log_dir=BASE_DIR / "var", check_jobs=LOCKS_CHECK_JOBS)
CRONTAB_PYTHON_EXECUTABLE = sys.executable
CRONTAB_DJANGO_MANAGE_PATH = str(BASE_DIR / "manage.py")

# --- The crontab line's environment (docs/deployment-cron.md) ------------------
# The line needs this project's settings (a different SYNC_CONTESTS_SCHEDULE would not
# even find its job), but carries no value: anyone who can read the crontab or
# /proc/*/cmdline would see it. `manage.py crontab_env` writes these variables, each one a
# job reads, to LOCKS_CRONTAB_ENV_FILE (mode 0600) and the line sources that file. Not the
# web's: the trigger, health and metrics tokens, the HTTPS and proxy switches, the admin
# login's limits, DJANGO_SUPERUSER_PASSWORD (tests/test_deploy_settings.py keeps the split).
LOCKS_CRONTAB_ENV_VARIABLES = (
    *("DATABASE_URL", "DJANGO_SECRET_KEY", "DJANGO_DEBUG", "DJANGO_SILENCED_SYSTEM_CHECKS"),
    *("LOCKS_DEFAULT_TTL", "LOCKS_TICK_WINDOW", "LOCKS_MAX_CLOCK_SKEW", "LOCKS_RUN_RETENTION_DAYS"),
    *("LOCKS_LOG_LEVEL", "CONTESTS_LOG_LEVEL", "LOCKS_CHECK_JOBS", "LOCKS_LEDGER_SLOTS"),
    *("DJANGO_ADMINS", "DJANGO_SERVER_EMAIL"),  # check_jobs emails the admins
    *("SYNC_CONTESTS_SCHEDULE", "SYNC_CONTESTS_LOCK_TTL", "SYNC_CONTESTS_MAX_RUN_TIME"),
    *("CODEFORCES_API_URL", "CODEFORCES_CONNECT_TIMEOUT", "CODEFORCES_READ_TIMEOUT"),
    *("CODEFORCES_TOTAL_TIMEOUT", "CODEFORCES_MAX_ATTEMPTS", "CODEFORCES_BACKOFF", "CODEFORCES_MAX_BYTES"),
    *("SEND_REMINDERS_SCHEDULE", "SEND_REMINDERS_LOCK_TTL", "SEND_REMINDERS_MAX_RUN_TIME"),
    *(
        "SEND_REMINDERS_CLAIM_TTL",
        "SEND_REMINDERS_MAX_ATTEMPTS",
        "SEND_REMINDERS_BATCH",
        "SEND_REMINDERS_CONNECTIONS",
        "SEND_REMINDERS_MESSAGE_ID_DOMAIN",
        "SEND_REMINDERS_UNSUBSCRIBE_MAILTO",
        "SITE_URL",
    ),
    *("EMAIL_URL", "EMAIL_BACKEND", "EMAIL_FILE_PATH", "EMAIL_TIMEOUT", "DEFAULT_FROM_EMAIL"),
)
LOCKS_CRONTAB_ENV_FILE = BASE_DIR / env.str("DJANGO_CRONTAB_ENV_FILE", "var/crontab.env")
CRONTAB_COMMAND_PREFIX = command_prefix(LOCKS_CRONTAB_ENV_FILE)

# --- Admin login: passwords and lockouts (docs/security.md) ---------------------
AUTH_PASSWORD_VALIDATORS = [
    {"NAME": "django.contrib.auth.password_validation.UserAttributeSimilarityValidator"},
    {"NAME": "django.contrib.auth.password_validation.MinimumLengthValidator"},
    {"NAME": "django.contrib.auth.password_validation.CommonPasswordValidator"},
    {"NAME": "django.contrib.auth.password_validation.NumericPasswordValidator"},
]
AUTHENTICATION_BACKENDS = [
    "axes.backends.AxesStandaloneBackend",  # first: refuses a locked-out pair before any check
    "django.contrib.auth.backends.ModelBackend",
]
AXES_FAILURE_LIMIT = env.int("AXES_FAILURE_LIMIT", 5)
AXES_COOLOFF_TIME = timedelta(hours=env.float("AXES_COOLOFF_TIME", 1.0))
AXES_LOCKOUT_PARAMETERS = [["username", "ip_address"]]
AXES_RESET_ON_SUCCESS = True  # a successful login forgets that pair's earlier failures
# The client address as the trigger's rate limit sees it (LOCKS_TRUSTED_PROXY_COUNT).
AXES_CLIENT_IP_CALLABLE = "locks.views.client_address"

# --- Production security (docs/deployment.md) ------------------------------
# Strict by default whenever DEBUG is off: `manage.py check --deploy` is clean with
# DJANGO_DEBUG=0, DJANGO_SECRET_KEY and DJANGO_ALLOWED_HOSTS set. Each switch can be
# turned off for a deployment that handles it elsewhere.
SECURE_SSL_REDIRECT = env.bool("DJANGO_SECURE_SSL_REDIRECT", not DEBUG)
# Monitors and platform probes often speak plain HTTP to the app itself. A /healthz
# request that carries an Authorization header is redirected all the same (its view).
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
# Opt-in: only behind a proxy that sets X-Forwarded-Proto itself and strips it from
# clients; otherwise any client could claim its plain-HTTP request is HTTPS.
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_X_FORWARDED_PROTO", "https") if env.bool("DJANGO_SECURE_PROXY_SSL_HEADER", False) else None
)
SECURE_HSTS_SECONDS = env.int("DJANGO_SECURE_HSTS_SECONDS", 0 if DEBUG else 31_536_000)
SECURE_HSTS_INCLUDE_SUBDOMAINS = env.bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEBUG)
SECURE_HSTS_PRELOAD = env.bool("DJANGO_SECURE_HSTS_PRELOAD", not DEBUG)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env.bool("DJANGO_SECURE_COOKIES", not DEBUG)
CSRF_TRUSTED_ORIGINS = env.list("DJANGO_CSRF_TRUSTED_ORIGINS", default=[])
SILENCED_SYSTEM_CHECKS = env.list("DJANGO_SILENCED_SYSTEM_CHECKS", default=[])
