"""A database error while `send_reminders` records a group (`_Group.record`; docs/reminders.md,
"Unknown is not failed", the guarantee): a real fault on the real database, no mock, against
a real run (a `manage.py` process: the exit code, the log lines and the lock's own record
are the product's path) and a real SMTP server (tests/smtp_standin.py).

The fault starts from the stand-in's ``on_message`` hook as the group's last message
arrives, before its 250: the run is waiting for that answer and writes nothing, and it
records the group only after it. So the fault is always in place when the record starts.
Where the fault is a lock held by the test, the test lets go of it once the run has logged
that it will try again (read from its stderr as it comes), or after the run has ended: no
timer decides the outcome.
"""

from __future__ import annotations

import re
import sqlite3
import subprocess
import threading
from datetime import timedelta
from urllib.parse import quote

import psycopg
import pytest
from django.db import connection

from contests.models import Reminder
from contests.reminders import RECORD_EVERY
from locks.operator import force_release
from tests.conftest import manage, project_env, spawn
from tests.contests.reminder_data import due_reminders, make_contest
from tests.contests.test_reminders_command import expire_claims, lock_lines
from tests.smtp_standin import smtp_standin

pytestmark = pytest.mark.slow

GROUP = 3  # due reminders: one group (fewer than RECORD_EVERY), recorded once
BUSY = 0.1  # s: the run's SQLite busy timeout, its PostgreSQL lock_timeout
RUN_NAME = "rectest-send-reminders"  # the run's PostgreSQL application_name
WARNING = re.compile(
    r" WARNING contests\.reminders claim=\S+ could not record its group \((.*)\); trying again in ([\d.]+) s$"
)


@pytest.fixture
def soon(transactional_db):
    return make_contest(1843, start=timedelta(hours=2))


def postgres() -> bool:
    return connection.vendor == "postgresql"


def run_url(url: str) -> str:
    """The test database's URL for the run: a short busy timeout (SQLite) or lock timeout
    (PostgreSQL), and, on PostgreSQL, a name to find its connection by."""
    if postgres():
        return f"{url}?application_name={RUN_NAME}&options={quote(f'-c lock_timeout={round(BUSY * 1000)}')}"
    return f"{url}?timeout={BUSY}"


def raw_connection(**options):
    """A connection of the test's own to the test database, outside Django (the SMTP
    stand-in's thread uses it, the test's thread lets go of it)."""
    sd = connection.settings_dict
    if postgres():
        return psycopg.connect(
            dbname=sd["NAME"],
            user=sd["USER"],
            password=sd["PASSWORD"],
            host=sd["HOST"],
            port=sd["PORT"],
            **options,
        )
    return sqlite3.connect(sd["NAME"], timeout=10, isolation_level=None, check_same_thread=False)


class WriteLock:
    """Every write to the reminders blocked by another connection until ``release``: on
    SQLite its one write lock (``BEGIN IMMEDIATE`` on the test database file), on PostgreSQL
    the reminders' table (``LOCK TABLE … IN EXCLUSIVE MODE``: reads go on, and the lock's
    own tables stay writable). The run waits ``BUSY`` for it, then gets an OperationalError
    ("database is locked", "canceling statement due to lock timeout")."""

    def __init__(self) -> None:
        self.conn = raw_connection()
        self.taken = threading.Event()

    def take(self) -> None:
        if postgres():
            self.conn.execute(f"LOCK TABLE {Reminder._meta.db_table} IN EXCLUSIVE MODE")
        else:
            self.conn.execute("BEGIN IMMEDIATE")
        self.taken.set()

    def release(self) -> None:
        self.conn.rollback()
        self.conn.close()


class Terminate:
    """PostgreSQL: the run's connection ended by the server (``pg_terminate_backend``, what a
    restart or a failover does to it), waiting until it is gone."""

    def __init__(self) -> None:
        self.conn = raw_connection(autocommit=True)
        self.ended = 0

    def take(self) -> None:
        rows = self.conn.execute(
            "SELECT pg_terminate_backend(pid, 5000) FROM pg_stat_activity WHERE application_name = %s",
            (RUN_NAME,),
        ).fetchall()
        self.ended = sum(ended for (ended,) in rows)

    def release(self) -> None:
        self.conn.close()


class Stderr:
    """A process's stderr, read as it comes, in a thread."""

    def __init__(self, proc: subprocess.Popen, *, waiting_for: str) -> None:
        self.lines: list[str] = []
        self.waiting_for = waiting_for
        self.changed = threading.Event()  # the awaited line came, or the stream ended
        self.thread = threading.Thread(target=self._read, args=(proc.stderr,), daemon=True)
        self.thread.start()

    def _read(self, stream) -> None:
        for line in stream:
            self.lines.append(line.rstrip("\n"))
            if self.waiting_for in line:
                self.changed.set()
        self.changed.set()

    def seen(self, *, timeout: float) -> bool:
        self.changed.wait(timeout)
        return any(self.waiting_for in line for line in self.lines)

    def text(self) -> str:
        self.thread.join(30)
        return "\n".join(self.lines)


def retries(stderr: str) -> list[tuple[str, float]]:
    """(error, pause) of each 'trying again' line of the record."""
    return [(m[1], float(m[2])) for line in stderr.splitlines() if (m := WARNING.search(line))]


def send_with_fault(db_url: str, fault, *, release_on_retry: bool, **settings: str):
    """Run send_reminders --force while ``fault`` starts as the group's last message
    arrives; let go of it once the run says it will try again (``release_on_retry``), or
    once the run has ended. The finished process, its stderr and the SMTP stand-in."""
    with smtp_standin() as server:

        def at_message(recipient: str) -> None:
            if server.total() == GROUP:
                fault.take()

        server.on_message = at_message
        env = project_env(
            DATABASE_URL=run_url(db_url), EMAIL_URL=f"smtp://127.0.0.1:{server.port}", **settings
        )
        proc = spawn(["manage.py", "send_reminders", "--force"], env=env)
        stderr = Stderr(proc, waiting_for="could not record its group")
        try:
            if release_on_retry:
                stderr.seen(timeout=60)
            else:
                proc.wait(timeout=60)
        finally:
            fault.release()
            try:
                proc.wait(timeout=60)  # its stdout: a line or two, never a full pipe
            finally:
                if proc.poll() is None:  # it did not end: a failure, and no process left behind
                    proc.kill()
                    proc.wait()
                proc.stdout.close()
        return proc, stderr.text(), server


def test_a_database_error_while_recording_a_group_is_retried_and_each_email_goes_out_once(db_url, soon):
    """SQLite: another connection holds the write lock past the run's busy timeout, and lets
    go once the run has said it will try again. PostgreSQL: the server ends the run's
    connection; the retry opens a new one. Either way the run records the group on a later
    try and succeeds; nothing is sent twice (without the retry, the run fails, its group
    unrecorded, to be sent again once its claims expire)."""
    pks = [reminder.pk for reminder in due_reminders(GROUP, contest=soon)]
    fault = Terminate() if postgres() else WriteLock()

    proc, stderr, server = send_with_fault(db_url, fault, release_on_retry=not postgres())

    assert proc.returncode == 0, stderr
    assert "Traceback" not in stderr
    tries = retries(stderr)
    assert tries, stderr
    error, pause = tries[0]
    assert pause == 0.5
    if postgres():
        assert fault.ended == 1  # the run's one connection
        assert error.startswith(("OperationalError: ", "InterfaceError: ")), error
        assert len(tries) == 1  # the new connection records at once
    else:
        assert error == "OperationalError: database is locked", error
    [line] = lock_lines(stderr)
    assert "outcome=succeeded" in line and f"due={GROUP} sent={GROUP} failed=0 uncertain=0" in line, line
    assert dict(server.received) == {f"user{n}@example.com": 1 for n in range(GROUP)}
    reminders = Reminder.objects.filter(pk__in=pks)
    assert reminders.filter(delivered_at__isnull=False, claimed_until=None, attempts=1).count() == GROUP


def test_a_database_outage_longer_than_the_retries_ends_the_run_and_leaves_the_group_claimed(db_url, soon):
    """The write lock is held until the run has ended. The record is tried again for a third
    of SEND_REMINDERS_CLAIM_TTL (7 s here: the least contests.E005 allows with a 2 s
    EMAIL_TIMEOUT), then the run fails (exit 1, one ERROR line, no traceback: a database
    error is expected). The messages it handed over are not recorded as delivered and stay
    claimed, one attempt counted, so no run sends them again before the claims expire
    (docs/reminders.md, "Unknown is not failed"). Once they expire, the next run sends them again
    and records them: a longer outage costs what a crash costs, at most RECORD_EVERY
    messages sent twice."""
    pks = [reminder.pk for reminder in due_reminders(GROUP, contest=soon)]
    claim_ttl = 7

    proc, stderr, server = send_with_fault(
        db_url,
        WriteLock(),
        release_on_retry=False,
        SEND_REMINDERS_CLAIM_TTL=str(claim_ttl),
        EMAIL_TIMEOUT="2",
    )

    assert proc.returncode == 1, stderr
    assert "Traceback" not in stderr
    tries = retries(stderr)
    assert tries and tries[0][1] == 0.5, stderr
    assert sum(pause for _, pause in tries) <= claim_ttl / 3  # it gave up at the deadline
    locked = "canceling statement due to lock timeout" if postgres() else "database is locked"
    assert all(error.startswith(f"OperationalError: {locked}") for error, _ in tries), tries
    [line] = [line for line in lock_lines(stderr) if " ERROR " in line]
    assert " ERROR locks.api job=send_reminders " in line, line
    assert "outcome=failed" in line and f"error=database error: OperationalError: {locked}" in line, line
    if not postgres():  # the lock's own tables are locked too: the lease expires by itself
        assert "could not record outcome failed: OperationalError: database is locked" in stderr, stderr
    assert dict(server.received) == {f"user{n}@example.com": 1 for n in range(GROUP)}
    reminders = Reminder.objects.filter(pk__in=pks)
    assert not reminders.filter(delivered_at__isnull=False).exists()
    # Still the run's: one claim, not released, the attempt counted.
    assert reminders.values("claimed_by").distinct().count() == 1
    assert reminders.filter(claimed_until__isnull=False, attempts=1, last_error="").count() == GROUP

    # What happens next: the claims expire (written into the past), the next run sends the
    # group again, at most RECORD_EVERY messages, and records it.
    force_release(job="send_reminders", by="test")  # SQLite: the failed run could not release it
    expire_claims()
    with smtp_standin() as server:
        env = project_env(DATABASE_URL=db_url, EMAIL_URL=f"smtp://127.0.0.1:{server.port}")
        again = manage("send_reminders", "--force", env=env)
    assert again.returncode == 0, again.stderr
    assert dict(server.received) == {f"user{n}@example.com": 1 for n in range(GROUP)}  # the second time
    assert GROUP <= RECORD_EVERY
    assert reminders.filter(delivered_at__isnull=False, claimed_until=None, attempts=2).count() == GROUP
