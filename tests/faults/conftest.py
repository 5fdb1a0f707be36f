"""Fixtures for the fault tests: processes, the PostgreSQL server, namespaces, faketime.

A test that needs something the machine cannot give (root, ``ip netns``,
faketime) skips and says why; under CI (``CI=true``, root, packages installed
by .ci/run) such a skip is a failure instead, so these tests cannot silently
stop running there.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator

import pytest
from django.db import connection, connections

from tests.conftest import project_env
from tests.faults import results
from tests.faults.net import Sandbox, netns_unavailable
from tests.faults.pg import PgServer
from tests.faults.support import Gate, Procs

OBSERVED = pytest.StashKey[str]()
POSTGRES_ONLY = "PostgreSQL-only scenario: runs in the PostgreSQL pass of `make test`"


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", "scenario(key): a fault scenario of tests/faults/results.py")


def unavailable(reason: str) -> None:
    """Skip for a missing capability, except under CI where it must be there."""
    if os.environ.get("CI", "").lower() == "true":
        pytest.fail(f"CI must run this fault test, but {reason}")
    pytest.skip(reason)


@pytest.fixture
def procs() -> Iterator[Procs]:
    started = Procs()
    try:
        yield started
    finally:
        started.kill_all()


@pytest.fixture
def gate() -> Iterator[Gate]:
    """Hang it on a stand-in (``standin.hook = gate``) to hold the first fetch until ``gate.open()``."""
    held = Gate()
    try:
        yield held
    finally:
        held.open()


@pytest.fixture
def fault_env(db_url: str, standin) -> Callable[..., dict[str, str]]:
    """Environment for a copy of the project on this machine: the test database, the stand-in."""

    def make(**extra: str) -> dict[str, str]:
        env = project_env(DATABASE_URL=db_url, CODEFORCES_API_URL=standin.url, LOCKS_LOG_LEVEL="INFO")
        env.update(extra)
        return env

    return make


@pytest.fixture
def postgres(db_url: str) -> str:
    if connection.vendor != "postgresql":
        pytest.skip(POSTGRES_ONLY)
    return db_url


@pytest.fixture
def pg_server(postgres: str) -> Iterator[PgServer]:
    """The run's PostgreSQL server, to stop and start; it is running again after the test."""
    server = PgServer.from_environment()
    if server is None:
        unavailable(
            "this test stops the PostgreSQL server, and only one started by scripts/with-postgres.sh "
            "(WITH_POSTGRES_DATA) may be stopped"
        )
    try:
        yield server
    finally:
        if not server.running():
            server.start()
        # The test process's own sessions died with the server; reconnect on next use.
        connections.close_all()


@pytest.fixture
def sandbox() -> Callable[[int], Sandbox]:
    """``sandbox(3)``: three hosts linked to this machine; removed after the test."""
    made: list[Sandbox] = []

    def make(size: int) -> Sandbox:
        reason = netns_unavailable()
        if reason:
            unavailable(reason)
        box = Sandbox(size)
        made.append(box)
        box.create()
        return box

    try:
        yield make
    finally:
        for box in made:
            box.destroy()


@pytest.fixture(scope="session")
def faketime() -> str:
    """The faketime wrapper, checked to shift the clock of a Python subprocess."""
    path = shutil.which("faketime")
    if path is None:
        unavailable("faketime (Debian package faketime) is not installed")
    probe = subprocess.run(
        [path, "-f", "+1d", sys.executable, "-c", "import time; print(time.time())"],
        capture_output=True,
        text=True,
        timeout=30,
    )
    if probe.returncode != 0 or abs(float(probe.stdout or 0) - time.time() - 86400) > 60:
        unavailable(f"faketime does not shift Python's clock here: {probe.stderr.strip() or probe.stdout}")
    return path


@pytest.fixture
def observe(request: pytest.FixtureRequest) -> Callable[[str], None]:
    """``observe("1 sync, 15 skips")``: what the scenario showed, for the table in docs/faults.md."""

    def note(text: str) -> None:
        request.node.stash[OBSERVED] = text

    return note


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item: pytest.Item, call: pytest.CallInfo):
    report = yield
    marker = item.get_closest_marker("scenario")
    if marker is None or (report.when != "call" and report.passed):
        return report
    if report.skipped:
        reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else str(report.longrepr)
        observed = reason.removeprefix("Skipped: ")
    elif report.failed:
        observed = str(report.longrepr.reprcrash.message if hasattr(report.longrepr, "reprcrash") else "")
        observed = observed.splitlines()[0][:200] if observed else report.when
    else:
        observed = item.stash.get(OBSERVED, "")
    try:
        backend = connection.vendor
    except Exception:  # settings unusable: nothing to file the result under
        return report
    results.record(backend=backend, key=marker.args[0], outcome=report.outcome, observed=observed)
    return report
