"""No wait on a locked lock row without a bound (docs/architecture.md, "The rules": 11; issue 17,
reproduction 4).

On PostgreSQL a write in progress (a fenced transaction) holds its job's lock row. A contender
that meets it skips as ``held`` at once and says so; renew does not wait for it, release a few
seconds at most; the operator's writes answer within their bound. The server ends a fenced
transaction that pauses longer than its TTL, so a holder frozen inside its write (SIGSTOP) loses
it: its write rolls back and the tick is taken over. On SQLite the whole file has one write
lock, and a contender waits for it at most the busy timeout, then skips with one WARNING.
"""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection, connections, transaction

from locks import lease as leases
from locks import operator as operations
from locks.db import RowLocked
from locks.lease import Lease, Skip, acquire, fenced, release, renew
from locks.models import JobPause, JobRun, SyncLock
from locks.operator import ensure_lock_row, force_release, pause_job, reset_tick, resume_job
from tests.conftest import ROOT, database_url, project_env
from tests.jobsapp.models import SlotWrite

TICK = datetime(2026, 11, 30, 14, 0, tzinfo=UTC)
TTL = timedelta(seconds=30)


def test_a_contender_that_meets_a_locked_row_skips_as_held_at_once_and_says_so(locked_row):
    release(lease=acquire(job="job", tick=TICK, ttl=TTL, holder="gone:1:a"), status="failed")
    locked_row("job")

    began = time.monotonic()
    skip = acquire(job="job", tick=TICK, ttl=TTL, holder="b:2:b")
    took = time.monotonic() - began

    assert isinstance(skip, Skip) and (skip.reason, skip.locked) == ("held", True)
    assert str(skip) == "the lock row is locked by a write in progress (last holder none, lease released)"
    assert took < 5  # three looks, 0.15 s apart; before, it waited for the write to end (60 s here)
    assert SyncLock.objects.get().token == 1


def test_renew_does_not_wait_for_a_locked_row_and_the_lease_stays(locked_row):
    lease = acquire(job="job", tick=TICK, ttl=TTL)
    assert isinstance(lease, Lease)
    locked_row("job")

    with pytest.raises(
        RowLocked, match=r"^renewing the lease on job: the lock row is locked by a write in progress$"
    ):
        renew(lease=lease)
    assert not lease.lost  # the heartbeat tries again at its next beat


def test_release_waits_for_a_locked_row_at_most_its_bound(locked_row, monkeypatch):
    monkeypatch.setattr(leases, "RELEASE_WAIT", 0.5)
    lease = acquire(job="job", tick=TICK, ttl=TTL)
    locked_row("job")

    began = time.monotonic()
    with pytest.raises(
        RowLocked, match=r"^releasing the lease on job \(token 1\): .* in progress for 0.5 s$"
    ):
        release(lease=lease, status="succeeded")

    assert time.monotonic() - began < 5
    assert SyncLock.objects.get().locked_until is not None  # it expires by itself


def test_the_operators_writes_answer_within_their_bound_and_say_why(locked_row, monkeypatch):
    """`locks release` said "nothing released" (the lease looked expired) and `--reset-tick` hung."""
    monkeypatch.setattr(operations, "OPERATOR_WAIT", 0.5)
    release(lease=acquire(job="job", tick=TICK, ttl=TTL, holder="a:1:a"), status="failed")
    before = SyncLock.objects.values().get()
    locked_row("job")

    with pytest.raises(RowLocked) as released:
        force_release(job="job", by="ops")
    with pytest.raises(CommandError) as command:
        call_command("locks", "release", "job", "--reset-tick", TICK.isoformat())
    with pytest.raises(RowLocked):
        reset_tick(job="job", expected_tick=TICK, by="ops")

    assert str(released.value) == (
        "force release of job: the lock row is locked by a write in progress for 0.5 s; "
        f"{operations.FROZEN_HINT}"
    )
    assert str(command.value).startswith(
        "force release of job: the lock row is locked by a write in progress"
    )
    assert SyncLock.objects.values().get() == before


def test_pause_and_resume_answer_within_five_seconds_while_a_write_holds_the_row(locked_row, monkeypatch):
    """They were plain UPDATEs: pausing a job whose holder is frozen inside its fenced write waited
    until the server ended that transaction (up to the TTL: 600 s for the sync), holding an admin
    request the whole time (issue 25)."""
    ensure_lock_row(job="write_slot")
    locked_row("write_slot")

    began = time.monotonic()
    with pytest.raises(RowLocked) as paused:
        pause_job(job="write_slot", by="cli:ops", note="mail relay down")
    took = time.monotonic() - began
    monkeypatch.setattr(operations, "OPERATOR_WAIT", 0.5)
    with pytest.raises(CommandError) as command:
        call_command("locks", "pause", "write_slot")
    assert not resume_job(job="write_slot", by="cli:ops").changed  # not paused: nothing to wait for

    assert took < 6  # its bound, 5 s, and no wait for the write (60 s here)
    assert str(paused.value) == (
        f"pause of write_slot: the lock row is locked by a write in progress for 5 s; {operations.FROZEN_HINT}"
    )
    assert str(command.value).startswith("pause of write_slot: the lock row is locked by a write in progress")
    assert SyncLock.objects.get().paused_at is None and not JobPause.objects.exists()


def test_a_fenced_transaction_is_ended_by_the_server_after_its_ttl_of_a_pause(postgres):
    lease = acquire(job="job", tick=TICK, ttl=timedelta(seconds=3.5))

    with fenced(lease), connection.cursor() as cursor:
        cursor.execute(
            "SELECT current_setting('idle_in_transaction_session_timeout'), current_setting('statement_timeout'), "
            "current_setting('lock_timeout')"
        )
        inside = cursor.fetchone()
    with connection.cursor() as cursor:
        cursor.execute("SELECT current_setting('idle_in_transaction_session_timeout')")
        after = cursor.fetchone()

    assert inside == ("3500ms", "3500ms", "3500ms")
    assert after == ("0",)  # for that transaction only


# --- real processes ------------------------------------------------------------------------


def _worker(url: str, *args: str) -> subprocess.Popen:
    argv = [sys.executable, "-m", "tests.locks.worker", "--job", "frozen", "--tick", TICK.isoformat(), *args]
    env = project_env(DATABASE_URL=url, LOCKS_LOG_LEVEL="INFO")
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _manage(url: str, *args: str) -> subprocess.Popen:
    env = project_env(DATABASE_URL=url)
    argv = [sys.executable, str(ROOT / "manage.py"), *args]
    return subprocess.Popen(
        argv, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


def _result(proc: subprocess.Popen, *, timeout: float) -> dict:
    out, err = proc.communicate(timeout=timeout)
    assert proc.returncode == 0, err
    return json.loads(out.strip().splitlines()[-1])


@pytest.mark.slow
def test_a_holder_frozen_inside_its_fenced_write_loses_it_and_the_tick_is_taken_over(postgres):
    """Reproduction 4: the holder, SIGSTOPped inside its fenced write, kept its row lock; once its
    lease had expired every contender waited on that row with no bound, `locks release` and
    `--reset-tick` hung. Now the operator's commands answer at once, the server ends the frozen
    transaction once it has paused for the TTL (15 s here), its row rolls back, and a contender
    takes the tick over; the frozen holder, resumed, records its run failed."""
    url = database_url()
    frozen = _worker(url, "--ttl", "15", "--write", "25", "--row")
    procs = [frozen]
    try:
        deadline = time.monotonic() + 60
        while '"writing"' not in (line := frozen.stdout.readline()) and time.monotonic() < deadline:
            assert line, frozen.stderr.read()
        frozen.send_signal(signal.SIGSTOP)
        froze = time.monotonic()
        release_ = _manage(url, "locks", "release", "frozen")
        reset = _manage(url, "locks", "release", "frozen", "--reset-tick", TICK.isoformat())
        procs += [release_, reset]
        answers = [proc.communicate(timeout=30) for proc in (release_, reset)]
        for proc, (_out, err) in zip((release_, reset), answers, strict=True):
            assert proc.returncode == 1, err
            assert "the lock row is locked by a write in progress for 5 s; nothing changed." in err, err
            assert "Traceback" not in err
        assert time.monotonic() - froze < 15  # both answered before the server ended the write

        # The server ends the frozen transaction 15 s after its INSERT; then the tick is free.
        taken = None
        while taken is None and time.monotonic() - froze < 45:
            result = _result(_worker(url, "--ttl", "15"), timeout=60)
            assert result["outcome"] in {"succeeded", "skipped"}, result
            if result["outcome"] == "succeeded":
                taken = result
            else:
                assert result["skip"] == "held", result
                time.sleep(1)
        assert taken is not None and taken["token"] == 2, "the tick was never taken over"
        frozen.send_signal(signal.SIGCONT)
        resumed = _result(frozen, timeout=60)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGCONT)
                proc.kill()
                proc.communicate()

    assert resumed["outcome"] == "failed", resumed
    assert not SlotWrite.objects.exists()  # its write was rolled back
    runs = dict(JobRun.objects.filter(job_name="frozen").values_list("token", "status"))
    assert runs == {1: "failed", 2: "succeeded"}
    lock = SyncLock.objects.get(job_name="frozen")
    assert (lock.token, lock.tick, lock.tick_done) == (2, TICK, True)


@pytest.mark.slow
def test_on_sqlite_a_contender_waits_for_the_write_lock_at_most_the_busy_timeout(transactional_db):
    """SQLite has no row locks: a fenced write holds the file's one write lock, which no server
    can take back from a frozen process. A contender waits for it at most the busy timeout
    (``?timeout=`` in DATABASE_URL, here 1 s), then skips with one WARNING, exit 0."""
    if connection.vendor != "sqlite":
        pytest.skip("SQLite only: PostgreSQL locks the row (tested above)")
    url = database_url()
    writer = _worker(url, "--ttl", "30", "--write", "20", "--row")
    try:
        deadline = time.monotonic() + 60
        while '"writing"' not in (line := writer.stdout.readline()) and time.monotonic() < deadline:
            assert line, writer.stderr.read()
        began = time.monotonic()
        contender = _worker(f"{url}?timeout=1")
        out, err = contender.communicate(timeout=60)
        took = time.monotonic() - began
    finally:
        writer.kill()
        writer.communicate()

    assert contender.returncode == 0, err
    result = json.loads(out.strip().splitlines()[-1])
    assert result["outcome"] == "skipped" and result["reason"].startswith("database unreachable: ")
    assert "database is locked" in result["reason"]
    assert [line for line in err.splitlines() if " WARNING " in line], err
    assert took < 15  # its start-up and 1 s of busy timeout, not the writer's 20 s


def test_an_operators_first_write_behind_another_uncommitted_insert_of_the_row_answers_within_its_bound(
    postgres, monkeypatch
):
    """Issue 35, item 9: ensure_lock_row's INSERT (pause, run now, check_jobs on a job that never
    ran) waited for another inserter's COMMIT without bound (30 s seen); it is acquire's insert now."""
    for module in (leases, operations):  # the bound, and the message that names it
        monkeypatch.setattr(module, "CREATE_WAIT", 0.5)
    inserted, done = threading.Event(), threading.Event()

    def insert() -> None:  # another process's first insert of the row, its COMMIT slow to come
        try:
            with transaction.atomic():
                SyncLock.objects.create(job_name="write_slot")
                inserted.set()
                done.wait(20)
        finally:
            connections.close_all()

    inserter = threading.Thread(target=insert, daemon=True)
    inserter.start()
    assert inserted.wait(10)
    try:
        began = time.monotonic()
        with pytest.raises(RowLocked) as paused:
            pause_job(job="write_slot", by="cli:ops", note="n")
        took = time.monotonic() - began
    finally:
        done.set()
        inserter.join(30)

    assert took < 10  # its bound (0.5 s here), not the other insert's 20 s
    assert str(paused.value) == (
        "creation of the lock row of write_slot: another process's insert of it has not committed "
        "within 0.5 s; nothing changed, try again"
    )
    assert SyncLock.objects.get().paused_at is None and not JobPause.objects.exists()


def test_every_lease_transaction_bounds_its_pauses_on_postgresql(postgres):
    """Issue 35, item 6: only fenced() set idle_in_transaction_session_timeout, so a process frozen
    inside acquire, renew, release, an operator's write or the first insert kept its row locked
    until it was killed. Each of their writes runs with the server's bound now, or (issue 36: the
    claim, the renewal, the release) as a statement that commits by itself: no transaction is left
    open between two statements for a frozen process to keep."""
    seen, reading = [], []

    def record(execute, sql, params, many, context):
        result = execute(sql, params, many, context)
        if sql.split(None, 1)[0].upper() in {"UPDATE", "INSERT"} and not reading:
            reading.append(sql)
            with context["connection"].cursor() as cursor:
                cursor.execute("SELECT current_setting('idle_in_transaction_session_timeout')")
                bound = cursor.fetchone()[0] if context["connection"].in_atomic_block else "autocommit"
                seen.append((sql.split(None, 1)[0].upper(), bound))
            reading.clear()
        return result

    with connection.execute_wrapper(record):
        lease = acquire(job="job", tick=TICK, ttl=TTL, holder="a:1:a")  # the first insert, the claim
        renew(lease=lease)
        release(lease=lease, status="failed")
        pause_job(job="write_slot", by="cli:ops")  # the row's insert, then the operator's write

    assert seen == [
        *(("UPDATE", "autocommit"), ("INSERT", "5s"), ("UPDATE", "autocommit")),  # the claim
        ("UPDATE", "5s"),  # its row stamped with the server's history (its first lease)
        ("UPDATE", "autocommit"),  # the renewal
        ("UPDATE", "autocommit"),  # the release
        *(("INSERT", "5s"), ("UPDATE", "5s"), ("INSERT", "5s")),  # the pause
    ]
