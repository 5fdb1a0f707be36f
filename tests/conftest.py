"""Shared fixtures: a real Codeforces stand-in on loopback, subprocess helpers
that run the project against the test database, and database URLs.

Two projects are under test, each in its own pytest run (``make test`` runs both): the
product (``config.settings``, the default) and a host project that installs only the
locks app (``--ds tests.hostproject.settings``), under which tests/locks runs.
"""

from __future__ import annotations

import fcntl
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


HOST_SETTINGS = "tests.hostproject.settings"
HOST_TESTS = ROOT / "tests" / "locks"  # the reusable app's tests: they run under the host project


def _under_host(path: Path) -> bool:
    return path == HOST_TESTS or HOST_TESTS in path.parents


def _settings_module() -> str:
    return os.environ.get("DJANGO_SETTINGS_MODULE", "config.settings")


def pytest_report_header(config) -> str:
    other = "config.settings" if _settings_module() == HOST_SETTINGS else f"--ds {HOST_SETTINGS}"
    return f"settings: {_settings_module()}; the other half of the suite runs with {other} (make test)"


def pytest_configure(config) -> None:
    """A path given on the command line that the other project's run owns is an error, not
    a silent 'no tests ran'."""
    host = _settings_module() == HOST_SETTINGS
    for arg in config.args:
        path = Path(arg.split("::")[0]).resolve()
        if path.exists() and path != ROOT / "tests" and _under_host(path) != host:
            where = f"--ds {HOST_SETTINGS}" if _under_host(path) else "the default settings (config.settings)"
            raise pytest.UsageError(f"{arg} runs under {where}")


def pytest_ignore_collect(collection_path: Path, config) -> bool | None:
    """tests/locks only under the host project; everything else only under config.settings."""
    if collection_path.is_dir() and collection_path == ROOT / "tests":
        return None
    if _under_host(collection_path) != (_settings_module() == HOST_SETTINGS):
        return True
    return None


@pytest.fixture(autouse=True)
def https_site_url(settings) -> None:
    """The test runner turns DEBUG off, where a reminder's unsubscribe link needs an https://
    SITE_URL (contests.E010, checked by every send_reminders run): give it one, as production has.
    A test of that check sets its own."""
    settings.SITE_URL = "https://contests.example.com"


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


def database_url(
    settings_dict: dict | None = None, *, host: str | None = None, port: int | None = None
) -> str:
    """A DATABASE_URL naming ``settings_dict`` (default: the database the tests use right now),
    reached through ``host`` and ``port`` when given. ``environ.Env.db_url_config`` (django-environ,
    as the settings) reads one back into a settings dict."""
    sd = settings_dict or connection.settings_dict
    if sd["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{sd['NAME']}"
    if sd["ENGINE"].endswith("postgresql"):
        auth = quote(sd["USER"] or "")
        if sd.get("PASSWORD"):
            auth += ":" + quote(sd["PASSWORD"])
        return (
            f"postgres://{auth}@{host or sd['HOST'] or '127.0.0.1'}:{port or sd['PORT'] or 5432}/{sd['NAME']}"
        )
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
    """Serve the project (the host project's, under its settings) with gunicorn, the documented
    production server; yields its base URL.

    The test binds the listening socket and hands it over (``--bind fd://N``), so
    requests queue in its backlog until the worker is up: no polling, no port race.
    ``command``: a whole command line instead, given the socket through gunicorn's
    ``GUNICORN_CMD_ARGS``.
    """
    wsgi = "tests.hostproject.wsgi" if env.get("DJANGO_SETTINGS_MODULE") == HOST_SETTINGS else "config.wsgi"
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    listener.bind(("127.0.0.1", 0))
    listener.listen(64)
    port = listener.getsockname()[1]
    bind = f"--bind fd://{listener.fileno()}"
    if command is None:
        command = [
            *(sys.executable, "-m", "gunicorn", wsgi, *bind.split()),
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


# --- cron -------------------------------------------------------------------------------


@contextmanager
def own_crontab_held() -> Iterator[None]:
    """The caller's own crontab, one test at a time for this user: `make test` runs two suites
    at once (and two checkouts may test at once), and a test that writes the crontab and puts it
    back would otherwise change it under another that reads it."""
    with open(f"/tmp/cf-contest-sync-crontab-{os.getuid()}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        yield


def shell_command(line: str) -> str:
    """What cron hands to /bin/sh for a crontab line: its command field, cron's escaped % unescaped."""
    command = line.split(" ", 5)[5].split(" # django-cronjobs")[0]
    assert "%" not in command.replace("\\%", "")  # cron would cut the line at a bare %
    return command.replace("\\%", "%")


def run_as_cron(command: str, *, timeout: float = 120) -> subprocess.CompletedProcess:
    """``command`` as cron runs it: with sh, almost no environment, under the user's umask."""
    return subprocess.run(
        ["env", "-i", "PATH=/usr/bin:/bin", "sh", "-c", f"umask 022; {command}"],
        capture_output=True,
        text=True,
        timeout=timeout,
    )
