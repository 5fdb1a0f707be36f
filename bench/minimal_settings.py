"""The floor for a skipping run: Django with no app installed, one database, no extras.

``python -c`` with this module does ``django.setup()`` and one query, which is the
least any Django process that consults the lock can do (bench part ``skip``).
The database is the benchmark's own, from ``DATABASE_URL`` (SQLite or PostgreSQL),
parsed with the standard library so that nothing is imported that the product
would have to import too.
"""

import os
from urllib.parse import unquote, urlsplit

SECRET_KEY = "benchmark-only-" + "x" * 40
INSTALLED_APPS: list[str] = []
USE_TZ = True

_url = urlsplit(os.environ["DATABASE_URL"])
if _url.scheme == "sqlite":
    DATABASES = {
        "default": {"ENGINE": "django.db.backends.sqlite3", "NAME": unquote(_url.path[1:])}
    }  # sqlite:///x is x
else:
    DATABASES = {
        "default": {
            "ENGINE": "django.db.backends.postgresql",
            "NAME": unquote(_url.path.lstrip("/")),
            "USER": unquote(_url.username or ""),
            "PASSWORD": unquote(_url.password or ""),
            "HOST": _url.hostname or "",
            "PORT": str(_url.port or ""),
        }
    }
