"""Shared fixtures: a real Codeforces stand-in on loopback, subprocess helpers
that run the project against the test database, and database URLs."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection

from tests.standin import Standin, serve

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture
def standin(settings) -> Iterator[Standin]:
    """A local Codeforces API serving the bundled real contest list."""
    fake = Standin()
    server = serve(fake)
    settings.CODEFORCES_API_URL = f"http://127.0.0.1:{server.server_port}/api"
    settings.CODEFORCES_BACKOFF = 0.01
    settings.CODEFORCES_TIMEOUT = (2.0, 2.0)
    fake.url = settings.CODEFORCES_API_URL
    try:
        yield fake
    finally:
        server.shutdown()
        server.server_close()


def database_url(settings_dict: dict | None = None) -> str:
    """A DATABASE_URL naming the database the tests use right now."""
    sd = settings_dict or connection.settings_dict
    if sd["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{sd['NAME']}"
    if sd["ENGINE"].endswith("postgresql"):
        auth = quote(sd["USER"] or "")
        if sd.get("PASSWORD"):
            auth += ":" + quote(sd["PASSWORD"])
        host = sd["HOST"] or "127.0.0.1"
        return f"postgres://{auth}@{host}:{sd['PORT'] or 5432}/{sd['NAME']}"
    raise NotImplementedError(f"no URL form for {sd['ENGINE']}")


@pytest.fixture
def db_url(transactional_db) -> str:
    return database_url()


def project_env(**extra: str) -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST")}
    env.update(DJANGO_DEBUG="1", PYTHONUNBUFFERED="1", CODEFORCES_BACKOFF="0.01")
    env.update(extra)
    return env


def manage(*args: str, env: dict[str, str], timeout: float = 60) -> subprocess.CompletedProcess:
    """Run ``manage.py`` as a real OS process."""
    return subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), *args],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def spawn(module_args: list[str], *, env: dict[str, str]) -> subprocess.Popen:
    """Start ``python -m …`` (or manage.py) without waiting."""
    return subprocess.Popen(
        [sys.executable, *module_args],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
