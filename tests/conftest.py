"""Shared fixtures: a real Codeforces stand-in on loopback, subprocess helpers
that run the project against the test database, and database URLs."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import quote

import pytest
from django.db import connection

from tests.standin import Standin, serve

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(autouse=True)
def only_the_sync_is_registered(settings) -> None:
    """In-process tests see one registered job, the sync, and register more where they
    need them (tests.locks.jobs.register); tests/locks/test_registry.py checks that the
    project's own LOCKS_JOBS has both jobs. Processes a test starts use the real setting."""
    settings.LOCKS_JOBS = {"sync_contests": settings.LOCKS_JOBS["sync_contests"]}


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


@contextmanager
def gunicorn(
    *, env: dict[str, str], log: Path, workers: int = 1, command: list[str] | None = None
) -> Iterator[str]:
    """Serve the project with gunicorn, the documented production server; yields its base URL.

    The test binds the listening socket and hands it over (``--bind fd://N``), so
    requests queue in its backlog until the worker is up: no polling, no port race.
    ``command``: a whole command line instead, given the socket through gunicorn's
    ``GUNICORN_CMD_ARGS``.
    """
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    bind = f"--bind fd://{listener.fileno()}"
    if command is None:
        command = [
            *(sys.executable, "-m", "gunicorn", "config.wsgi", *bind.split()),
            *("--workers", str(workers), "--timeout", "120", "--access-logfile", "-"),
        ]
    else:
        env = {**env, "GUNICORN_CMD_ARGS": bind}
    with log.open("w") as out:
        process = subprocess.Popen(
            command,
            cwd=ROOT,
            env=env,
            stdout=out,
            stderr=subprocess.STDOUT,
            pass_fds=(listener.fileno(),),
        )
    listener.close()  # gunicorn holds it now; if it dies, connections are refused at once
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        process.terminate()
        try:
            process.wait(timeout=15)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait()
