"""Turn ``DATABASE_URL`` into a Django ``DATABASES["default"]`` entry.

One code path (the ORM) serves every backend; only connection options differ.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

import dj_database_url
from django.core.exceptions import ImproperlyConfigured

# Seconds to wait for a connection before a tick is skipped (lock semantic 8).
CONNECT_TIMEOUT = 5
# Seconds an SQLite writer waits for another process's write transaction.
SQLITE_BUSY_TIMEOUT = 30

SQL_SCHEMES = {"sqlite", "postgres", "postgresql", "pgsql", "postgis"}
MONGO_SCHEMES = {"mongodb", "mongodb+srv"}


def database_from_url(url: str, *, base_dir: Path) -> dict:
    scheme = urlsplit(url).scheme.lower()
    if scheme in MONGO_SCHEMES:
        return _mongodb(url)
    if scheme not in SQL_SCHEMES:
        raise ImproperlyConfigured(
            f"DATABASE_URL scheme {scheme or '(none)'!r} is not supported; "
            "use sqlite:///path, postgres://user@host/db or mongodb://host/db."
        )
    config = dj_database_url.parse(url)
    if config["ENGINE"] == "django.db.backends.sqlite3":
        return _sqlite(config, base_dir=base_dir)
    return _postgres(config)


def _sqlite(config: dict, *, base_dir: Path) -> dict:
    name = Path(config["NAME"] or "db.sqlite3")
    if not name.is_absolute():
        name = base_dir / name
    config["NAME"] = str(name)
    config["OPTIONS"] = {
        # BEGIN IMMEDIATE takes the write lock up front: two writers never
        # deadlock on a read-to-write upgrade, they queue on the busy timeout.
        "transaction_mode": "IMMEDIATE",
        "timeout": SQLITE_BUSY_TIMEOUT,
        "init_command": (
            "PRAGMA journal_mode=WAL;"
            "PRAGMA synchronous=NORMAL;"
            f"PRAGMA busy_timeout={SQLITE_BUSY_TIMEOUT * 1000};"
        ),
    }
    config["TEST"] = {"NAME": str(name.with_name(f"test_{name.name}"))}
    return config


def _postgres(config: dict) -> dict:
    config["ENGINE"] = "django.db.backends.postgresql"
    options = config.setdefault("OPTIONS", {})
    options.setdefault("connect_timeout", CONNECT_TIMEOUT)
    # A peer that vanishes mid-query (network cut) is noticed in seconds,
    # not after the kernel's 15-minute retransmission limit.
    options.setdefault("keepalives", 1)
    options.setdefault("keepalives_idle", 5)
    options.setdefault("keepalives_interval", 2)
    options.setdefault("keepalives_count", 3)
    options.setdefault("tcp_user_timeout", 10_000)
    options.setdefault("application_name", "cf-contest-sync")
    return config


def _mongodb(url: str) -> dict:
    name = urlsplit(url).path.lstrip("/")
    if not name:
        raise ImproperlyConfigured(
            "A MongoDB DATABASE_URL must name the database: mongodb://host:27017/contests"
        )
    timeout_ms = CONNECT_TIMEOUT * 1000
    return {
        "ENGINE": "django_mongodb_backend",
        # The backend parses the connection string itself.
        "HOST": url,
        "NAME": name,
        "OPTIONS": {
            "serverSelectionTimeoutMS": timeout_ms,
            "connectTimeoutMS": timeout_ms,
        },
    }


def is_mongodb(config: dict) -> bool:
    return config["ENGINE"] == "django_mongodb_backend"
