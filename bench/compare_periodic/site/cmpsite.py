"""Settings of the comparison's minimal project: CMP_TOOL names the scheduler under test
(periodic_tasks, crontask or dbtasks), DATABASE_URL its PostgreSQL database. Tasks are stored
and run by django-dbtasks' DatabaseBackend for all three (its taskrunner is the worker)."""

import os
from urllib.parse import urlsplit

TOOL = os.environ["CMP_TOOL"]
SECRET_KEY = "compare-periodic"  # noqa: S105 (a throwaway project)
DEBUG = False
USE_TZ = True
TIME_ZONE = "UTC"
ROOT_URLCONF = None
DEFAULT_AUTO_FIELD = "django.db.models.BigAutoField"
INSTALLED_APPS = ["dbtasks", "cmpapp"] + {
    "periodic_tasks": ["django_periodic_tasks"],
    "crontask": ["crontask"],
    "dbtasks": [],
}[TOOL]

_url = urlsplit(os.environ["DATABASE_URL"])
DATABASES = {
    "default": {
        "ENGINE": "django.db.backends.postgresql",
        "NAME": _url.path.lstrip("/"),
        "USER": _url.username or "",
        "PASSWORD": _url.password or "",
        "HOST": _url.hostname or "",
        "PORT": str(_url.port or ""),
    }
}
_periodic = {"cmpapp.tasks.tick": "* * * * *"} if TOOL == "dbtasks" else {}
TASKS = {"default": {"BACKEND": "dbtasks.backend.DatabaseBackend", "OPTIONS": {"periodic": _periodic}}}
LOGGING = {
    "version": 1,
    "disable_existing_loggers": False,
    "handlers": {"out": {"class": "logging.StreamHandler", "formatter": "t"}},
    "formatters": {"t": {"format": "%(asctime)s %(process)d %(name)s %(message)s"}},
    "root": {"handlers": ["out"], "level": "INFO"},
}
