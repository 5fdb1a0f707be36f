"""What tests/locks share; they run under the host project (tests/hostproject/settings.py),
whose jobs (tests/jobsapp/jobs.py) are registered in every test."""

import glob
import json
import os
import shutil
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from pathlib import Path

import pytest
from django.db import connection, connections, transaction
from hypothesis import settings as hypothesis_settings

from locks.models import SyncLock
from tests.conftest import ROOT, project_env, spawn

TICK = datetime(2026, 11, 30, 14, 0, tzinfo=UTC)

# Hypothesis (tests/locks/test_schedule_zones.py): 1,000 examples a property under CI, a few
# hundred by hand; HYPOTHESIS_PROFILE picks one. No deadline: a shared CI machine is uneven.
# 1,000 since stop 50: its examples are drawn in a year of a change of the zone's offset, so about
# half of them lie near one (DST nights, new standard offsets), as many as of 2,000 before.
hypothesis_settings.register_profile("ci", max_examples=1000, deadline=None, database=None)
hypothesis_settings.register_profile("dev", max_examples=300, deadline=None)
hypothesis_settings.load_profile(
    os.environ.get("HYPOTHESIS_PROFILE") or ("ci" if os.environ.get("CI", "").lower() == "true" else "dev")
)


class Contenders:
    """Start worker processes that wait at a start line, then release them together."""

    def __init__(self, db_url: str, tmp_path: Path) -> None:
        self.env = project_env(DATABASE_URL=db_url)
        self.go = tmp_path / "go"
        self.procs = []

    def start(self, count: int, *args: str) -> None:
        for _ in range(count):
            self.procs.append(spawn(["-m", "tests.locks.worker", "--go", str(self.go), *args], env=self.env))

    def release(self) -> None:
        self.go.touch()

    def results(self, timeout: float = 90) -> list[dict]:
        out = []
        for proc in self.procs:
            stdout, stderr = proc.communicate(timeout=timeout)
            assert proc.returncode == 0, stderr
            out.append(json.loads(stdout.strip().splitlines()[-1]))
        self.procs = []
        return out


@pytest.fixture
def contenders(db_url, tmp_path):
    crowd = Contenders(db_url, tmp_path)
    yield crowd
    for proc in crowd.procs:
        proc.kill()


def register(settings, **jobs: dict) -> None:
    """Register ``jobs`` beside the host project's own for one test (a new dict: undone afterwards)."""
    settings.LOCKS_JOBS = {**settings.LOCKS_JOBS, **jobs}


def reschedule(settings, job: str, expression: str) -> None:
    """Give one registered job another schedule for one test."""
    register(settings, **{job: {**settings.LOCKS_JOBS[job], "schedule": expression}})


def wait_for(condition, *, timeout: float, what: str) -> None:
    """Poll ``condition`` every 0.1 s; fail naming ``what`` after ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.1)


@contextmanager
def schedulers(env: dict[str, str], logs: list[Path], *jobs: str) -> Iterator[list[subprocess.Popen]]:
    """One ``run_scheduler JOB…`` process per log file (its stdout and stderr), stopped with
    SIGTERM on the way out (killed if it has not stopped within 30 s)."""
    procs = []
    for log in logs:
        with log.open("w") as out:  # the child keeps its own descriptor
            command = [sys.executable, str(ROOT / "manage.py"), "run_scheduler", *jobs]
            procs.append(subprocess.Popen(command, cwd=ROOT, env=env, stdout=out, stderr=out))
    try:
        yield procs
    finally:
        for proc in procs:
            proc.send_signal(signal.SIGTERM)
        for proc in procs:
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


POSTGRES_ONLY = "PostgreSQL only: SQLite locks the whole file, not a row (its busy timeout bounds the wait)"


@pytest.fixture
def postgres(transactional_db):
    if connection.vendor != "postgresql":
        pytest.skip(POSTGRES_ONLY)


@pytest.fixture
def locked_row(postgres):
    """``lock(job)``: that job's lock row locked by another connection's open transaction (a
    write in progress) until the test ends."""
    done = threading.Event()
    threads = []

    def hold(job: str, locked: threading.Event) -> None:
        try:
            with transaction.atomic():
                list(SyncLock.objects.select_for_update().filter(job_name=job))
                locked.set()
                done.wait(60)
        finally:
            connections.close_all()

    def lock(job: str) -> None:
        locked = threading.Event()
        thread = threading.Thread(target=hold, args=(job, locked), daemon=True)
        thread.start()
        threads.append(thread)
        assert locked.wait(10), "the row was not locked"

    yield lock
    done.set()
    for thread in threads:
        thread.join(10)


# --- a database clock after a night in 2027 ------------------------------------------------


def faketime_or_skip() -> str:
    """The faketime wrapper (Debian package faketime); under CI its absence is a failure."""
    path = shutil.which("faketime")
    if path is None:
        if os.environ.get("CI", "").lower() == "true":
            pytest.fail("CI must run this test, but faketime (Debian package faketime) is not installed")
        pytest.skip("faketime (Debian package faketime) is not installed")
    return path


def offset_to(moment: datetime) -> str:
    """``faketime -f`` for a clock at ``moment`` now (relative: an absolute one is read in TZ)."""
    return f"{round(moment.timestamp() - time.time()):+d}"


def _pg_ctl(*args: str, env_prefix: tuple[str, ...] = ()) -> None:
    """pg_ctl of the server scripts/with-postgres.sh started (as its owner when run as root)."""
    data = os.environ["WITH_POSTGRES_DATA"]
    argv = [*env_prefix, os.path.join(os.environ["WITH_POSTGRES_BIN"], "pg_ctl"), "-D", data, *args]
    runas = os.environ.get("WITH_POSTGRES_RUNAS", "root")
    if os.geteuid() == 0 and runas != "root":
        argv = ["runuser", "-u", runas, "--", *argv]
    subprocess.run(argv, check=True, capture_output=True, timeout=90)


def _pg_start(env_prefix: tuple[str, ...] = ()) -> None:
    log = os.path.join(os.path.dirname(os.environ["WITH_POSTGRES_DATA"]), "postgres.log")
    _pg_ctl("-l", log, "-w", "-t", "60", "start", env_prefix=env_prefix)


@pytest.fixture
def database_clock_at(db_url):
    """``database_clock_at(moment)``: the database's clock reads ``moment`` from now on, so that
    processes faked to a night in the future claim its slots as past ones (the future bound,
    rule 3, is judged on the database clock). SQLite's clock is each process's own (fake it
    with ``offset_to``); PostgreSQL's is the server's: the scripts/with-postgres.sh server is
    restarted under libfaketime, and restarted on the real clock after the test."""
    restarted = []

    def at(moment: datetime) -> None:
        if connection.vendor != "postgresql":
            return
        if "WITH_POSTGRES_DATA" not in os.environ:
            pytest.skip(
                "needs the PostgreSQL server of scripts/with-postgres.sh (WITH_POSTGRES_DATA) to restart"
            )
        faketime_or_skip()
        # libfaketime itself, not the faketime wrapper (pg_ctl hangs under it), and the monotonic
        # clock left real: pg_ctl and the server wait on it.
        [library] = glob.glob("/usr/lib/*/faketime/libfaketime.so.1") or [None]
        if library is None:
            pytest.skip("libfaketime.so.1 (Debian package libfaketime) is not where Debian puts it")
        connections.close_all()
        _pg_ctl("-m", "fast", "-w", "-t", "60", "stop")
        restarted.append(moment)
        fake = (
            "env",
            f"LD_PRELOAD={library}",
            f"FAKETIME={offset_to(moment)}",
            "FAKETIME_DONT_FAKE_MONOTONIC=1",
        )
        _pg_start(env_prefix=fake)

    yield at
    if restarted:
        connections.close_all()
        _pg_ctl("-m", "fast", "-w", "-t", "60", "stop")
        _pg_start()
