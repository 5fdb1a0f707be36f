"""The databases the benchmark runs on: a fresh SQLite file per run, or a
PostgreSQL database whose tables it empties (a throwaway cluster, scripts/with-postgres.sh,
if asked)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
WORK = ROOT / "var" / "bench"
TABLES = ("contests_reminder", "contests_contest", "locks_jobrun", "locks_synclock", "auth_user")


def base_env(**extra: str) -> dict[str, str]:
    """The environment every benchmark process runs with: production-like
    (DEBUG off, so Django keeps no query log), big payloads allowed."""
    env = {key: value for key, value in os.environ.items() if not key.startswith(("PYTEST", "DJANGO_"))}
    env.update(
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY="benchmark-only-" + "x" * 40,
        SITE_URL="https://contests.example.com",  # the reminders' unsubscribe links (contests.E010)
        CODEFORCES_MAX_BYTES=str(512 * 1024 * 1024),
        CODEFORCES_BACKOFF="0.01",
        CODEFORCES_READ_TIMEOUT="120",
        LOCKS_LOG_LEVEL="WARNING",
        CONTESTS_LOG_LEVEL="WARNING",
        PYTHONPATH=str(ROOT),
    )
    env.update(extra)
    return env


def manage(*args: str, env: dict[str, str]) -> None:
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args], cwd=ROOT, env=env, capture_output=True, text=True
    )
    if done.returncode:
        raise RuntimeError(f"manage.py {' '.join(args)} failed:\n{done.stderr[-3000:]}")


@dataclass
class Backend:
    name: str  # "sqlite" or "postgresql"
    url: str
    version: str = ""
    floor_args: list[str] = field(default_factory=list)

    def env(self, **extra: str) -> dict[str, str]:
        return base_env(DATABASE_URL=self.url, **extra)

    def prepare(self) -> None:
        raise NotImplementedError

    def reset(self) -> None:
        """Empty every table the benchmark writes."""
        raise NotImplementedError

    def raw(self):
        """A raw driver connection (sqlite3 / psycopg), autocommit."""
        raise NotImplementedError


class SQLite(Backend):
    def __init__(self) -> None:
        WORK.mkdir(parents=True, exist_ok=True)
        self.path = WORK / "bench.sqlite3"
        self.template = WORK / "template.sqlite3"
        import sqlite3

        super().__init__("sqlite", f"sqlite:///{self.path}", f"SQLite {sqlite3.sqlite_version}")
        self.floor_args = ["--sqlite", str(self.path)]

    def prepare(self) -> None:
        _remove_sqlite(self.template)
        manage("migrate", "--noinput", "-v", "0", env=base_env(DATABASE_URL=f"sqlite:///{self.template}"))
        self.reset()

    def reset(self) -> None:
        # A fresh copy of the migrated file: no free pages or stale WAL left by the previous run.
        _remove_sqlite(self.path)
        shutil.copyfile(self.template, self.path)

    def raw(self):
        import sqlite3

        db = sqlite3.connect(self.path, isolation_level=None)
        db.execute("PRAGMA synchronous=NORMAL")
        return db


def _remove_sqlite(path: Path) -> None:
    for suffix in ("", "-wal", "-shm", "-journal"):
        Path(f"{path}{suffix}").unlink(missing_ok=True)


class PostgreSQL(Backend):
    def __init__(self, url: str) -> None:
        super().__init__("postgresql", url)
        self.conninfo = conninfo(url)
        self.floor_args = ["--pg", self.conninfo]

    def prepare(self) -> None:
        manage("migrate", "--noinput", "-v", "0", env=self.env())
        with self.raw() as db:
            self.version = "PostgreSQL " + db.execute("SHOW server_version").fetchone()[0]
        self.reset()

    def reset(self) -> None:
        with self.raw() as db:
            db.execute(f"TRUNCATE {', '.join(TABLES)} RESTART IDENTITY CASCADE")

    def raw(self):
        import psycopg

        return psycopg.connect(self.conninfo, autocommit=True)


def conninfo(url: str) -> str:
    """A libpq connection string for a postgres:// URL (django-environ parses it)."""
    import environ

    config = environ.Env.db_url_config(url)
    items = {
        "host": config["HOST"] or "127.0.0.1",
        "port": str(config["PORT"] or 5432),
        "dbname": config["NAME"] or "postgres",
        "user": config["USER"] or "postgres",
    }
    if config["PASSWORD"]:
        items["password"] = config["PASSWORD"]
    return " ".join(f"{key}={value}" for key, value in items.items())
