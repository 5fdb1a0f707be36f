"""Settings, all driven by the environment (see README "Configuration")."""

import os
import shlex
import sys
from pathlib import Path

from django.core.exceptions import ImproperlyConfigured

from config.database import (
    MONGODB_APP_CONFIGS,
    MONGODB_AUTO_FIELD,
    MONGODB_MIGRATION_MODULES,
    database_from_url,
    is_mongodb,
)

BASE_DIR = Path(__file__).resolve().parent.parent


def env_bool(name: str, default: bool = False) -> bool:
    value = os.environ.get(name)
    if value is None or value == "":
        return default
    if value.lower() in {"1", "true", "yes", "on"}:
        return True
    if value.lower() in {"0", "false", "no", "off"}:
        return False
    raise ImproperlyConfigured(f"{name}={value!r}: use 1/0, true/false, yes/no or on/off.")


def env_list(name: str, default: str = "") -> list[str]:
    return [item.strip() for item in os.environ.get(name, default).split(",") if item.strip()]


DEBUG = env_bool("DJANGO_DEBUG")

SECRET_KEY = os.environ.get("DJANGO_SECRET_KEY", "")
if not SECRET_KEY:
    if not DEBUG:
        raise ImproperlyConfigured(
            "DJANGO_SECRET_KEY is not set. Set it to a long random string, "
            "or set DJANGO_DEBUG=1 for local development."
        )
    SECRET_KEY = "django-insecure-development-only-key"  # noqa: S105

ALLOWED_HOSTS = env_list("DJANGO_ALLOWED_HOSTS", "localhost,127.0.0.1,[::1]" if DEBUG else "")

INSTALLED_APPS = [
    "django.contrib.admin",
    "django.contrib.auth",
    "django.contrib.contenttypes",
    "django.contrib.sessions",
    "django.contrib.messages",
    "django.contrib.staticfiles",
    "django_crontab",
    "locks",
    "contests",
    "contests.ops",
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

DATABASES = {
    "default": database_from_url(os.environ.get("DATABASE_URL") or "sqlite:///db.sqlite3", base_dir=BASE_DIR)
}
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"

LANGUAGE_CODE = "en-us"
TIME_ZONE = "UTC"
USE_I18N = True
USE_TZ = True

STATIC_URL = "static/"
STATIC_ROOT = BASE_DIR / "staticfiles"
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
        "locks": {"level": os.environ.get("LOCKS_LOG_LEVEL", "INFO")},
        "contests": {"level": os.environ.get("CONTESTS_LOG_LEVEL", "INFO")},
    },
}

# --- The lock (locks app) -------------------------------------------------
# Lease length when a job does not name its own; the heartbeat renews every third.
LOCKS_DEFAULT_TTL = int(os.environ.get("LOCKS_DEFAULT_TTL", "300"))
# JobRun rows older than this are deleted when a run finishes.
LOCKS_RUN_RETENTION_DAYS = int(os.environ.get("LOCKS_RUN_RETENTION_DAYS", "30"))
# Warn when this host's clock and the database's disagree by more (seconds).
LOCKS_MAX_CLOCK_SKEW = int(os.environ.get("LOCKS_MAX_CLOCK_SKEW", "120"))
# A run claims the upcoming slot when it is at most this far ahead (seconds; capped
# at a quarter of the gap between slots), else the latest slot at or before now.
LOCKS_TICK_WINDOW = int(os.environ.get("LOCKS_TICK_WINDOW", "300"))

# --- The sync (contests app) ----------------------------------------------
SYNC_CONTESTS_SCHEDULE = os.environ.get("SYNC_CONTESTS_SCHEDULE", "0 * * * *")
SYNC_CONTESTS_LOCK_TTL = int(os.environ.get("SYNC_CONTESTS_LOCK_TTL", "600"))
CODEFORCES_API_URL = os.environ.get("CODEFORCES_API_URL", "https://codeforces.com/api")
# (connect, read) seconds per request.
CODEFORCES_TIMEOUT = (
    float(os.environ.get("CODEFORCES_CONNECT_TIMEOUT", "5")),
    float(os.environ.get("CODEFORCES_READ_TIMEOUT", "30")),
)
CODEFORCES_MAX_ATTEMPTS = int(os.environ.get("CODEFORCES_MAX_ATTEMPTS", "3"))
# Base of the exponential backoff between attempts, seconds. Codeforces allows
# about one call per two seconds.
CODEFORCES_BACKOFF = float(os.environ.get("CODEFORCES_BACKOFF", "2"))
CODEFORCES_MAX_BYTES = int(os.environ.get("CODEFORCES_MAX_BYTES", str(20 * 1024 * 1024)))

# django-crontab writes one crontab line per host; the lock makes it run once.
CRONJOBS = [
    (
        SYNC_CONTESTS_SCHEDULE,
        "django.core.management.call_command",
        ["sync_contests"],
        {"verbosity": 0},  # the log line on stderr is the record
        f">> {BASE_DIR / 'var' / 'sync_contests.log'} 2>&1",
    ),
]
CRONTAB_PYTHON_EXECUTABLE = sys.executable
CRONTAB_DJANGO_MANAGE_PATH = str(BASE_DIR / "manage.py")
# The cron line carries this project's settings from the environment `crontab add`
# ran in (a different SYNC_CONTESTS_SCHEDULE would otherwise not even find its job).
# Values are shell-quoted, and % escaped because cron turns a bare % into a newline.
CRONTAB_ENV_PREFIXES = ("DATABASE_URL", "DJANGO_", "CODEFORCES_", "SYNC_", "LOCKS_", "MONGODB_")
CRONTAB_COMMAND_PREFIX = " ".join(
    f"{name}={shlex.quote(value)}".replace("%", "\\%")
    for name, value in sorted(os.environ.items())
    if name.startswith(CRONTAB_ENV_PREFIXES) and value
)

# --- Admin (locks app) -------------------------------------------------------
# Cron expression of each scheduled job, by lock name: the locks admin shows
# the next tick from it. Named here because `locks` never imports the apps
# whose jobs it runs.
LOCKS_SCHEDULES = {"sync_contests": SYNC_CONTESTS_SCHEDULE}

# --- Production security (README "Deployment") ------------------------------
# Strict by default whenever DEBUG is off: `manage.py check --deploy` is clean with
# DJANGO_DEBUG=0, DJANGO_SECRET_KEY and DJANGO_ALLOWED_HOSTS set. Each switch can be
# turned off for a deployment that handles it elsewhere.
SECURE_SSL_REDIRECT = env_bool("DJANGO_SECURE_SSL_REDIRECT", not DEBUG)
# Monitors and platform probes often speak plain HTTP to the app itself.
SECURE_REDIRECT_EXEMPT = [r"^healthz$"]
# Opt-in: only behind a proxy that sets X-Forwarded-Proto itself and strips it from
# clients; otherwise any client could claim its plain-HTTP request is HTTPS.
SECURE_PROXY_SSL_HEADER = (
    ("HTTP_X_FORWARDED_PROTO", "https") if env_bool("DJANGO_SECURE_PROXY_SSL_HEADER") else None
)
SECURE_HSTS_SECONDS = int(os.environ.get("DJANGO_SECURE_HSTS_SECONDS") or (0 if DEBUG else 31_536_000))
SECURE_HSTS_INCLUDE_SUBDOMAINS = env_bool("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", not DEBUG)
SECURE_HSTS_PRELOAD = env_bool("DJANGO_SECURE_HSTS_PRELOAD", not DEBUG)
SESSION_COOKIE_SECURE = CSRF_COOKIE_SECURE = env_bool("DJANGO_SECURE_COOKIES", not DEBUG)
CSRF_TRUSTED_ORIGINS = env_list("DJANGO_CSRF_TRUSTED_ORIGINS")
SILENCED_SYSTEM_CHECKS = env_list("DJANGO_SILENCED_SYSTEM_CHECKS")
if os.environ.get("DJANGO_STATIC_ROOT"):
    STATIC_ROOT = Path(os.environ["DJANGO_STATIC_ROOT"])
# How many proxies in front of the app append to X-Forwarded-For. 0 (the default):
# the header is ignored and the client address is the TCP peer, so it cannot be
# spoofed. Used for the trigger's per-client rate limit.
TRUSTED_PROXY_COUNT = int(os.environ.get("DJANGO_TRUSTED_PROXY_COUNT", "0"))

# --- HTTP trigger and health endpoint (contests.ops) --------------------------
# POST /api/jobs/sync_contests/run answers 404 until this is set (32+ characters).
SYNC_TRIGGER_TOKEN = os.environ.get("SYNC_TRIGGER_TOKEN", "")
# At most one trigger request per client address per this many seconds.
SYNC_TRIGGER_RATE_WINDOW = int(os.environ.get("SYNC_TRIGGER_RATE_WINDOW", "10"))

# --- MongoDB (README "MongoDB") --------------------------------------------
# Only when DATABASE_URL is mongodb:// or mongodb+srv://: ObjectId primary keys,
# contrib AppConfigs that do not pin AutoField, and the migrations in
# mongo_migrations/. SQLite and PostgreSQL keep the apps' own migrations.
if is_mongodb(DATABASES["default"]):
    DEFAULT_AUTO_FIELD = MONGODB_AUTO_FIELD
    INSTALLED_APPS = [MONGODB_APP_CONFIGS.get(app, app) for app in INSTALLED_APPS]
    MIGRATION_MODULES = MONGODB_MIGRATION_MODULES
