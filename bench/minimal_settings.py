"""The floor for a skipping run: Django with no app installed, one database, no extras.

``python -c`` with this module does ``django.setup()`` and one query, which is the
least any Django process that consults the lock can do (bench part ``skip``).
The database is the benchmark's own, from ``DATABASE_URL`` (SQLite or PostgreSQL),
parsed by django-environ, as the product's settings parse it: nothing is imported that
the product would not import too.
"""

import os

import environ

SECRET_KEY = "benchmark-only-" + "x" * 40
INSTALLED_APPS: list[str] = []
USE_TZ = True
DATABASES = {"default": environ.Env.db_url_config(os.environ["DATABASE_URL"])}
