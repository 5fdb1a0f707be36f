"""The database goes away: stopped mid-sync, stopped under a waiting copy, or silent."""

from __future__ import annotations

import re
import time

import psycopg
import pytest
from django.db import connections

from contests.models import Contest
from locks.models import SyncLock
from tests.conftest import project_env
from tests.faults.support import SilentServer, wait_until

TICK_0 = "2026-03-03T09:00:00+00:00"
TICK_1 = "2026-03-03T10:00:00+00:00"
TICK_2 = "2026-03-03T11:00:00+00:00"
TTL = 3


def warnings(text: str) -> list[str]:
    return [line for line in text.splitlines() if " WARNING " in line]


def errors(text: str) -> list[str]:
    return [line for line in text.splitlines() if " ERROR " in line]


def sync_after_restart(procs, env) -> int:
    """Once the old lease has run out, the next tick syncs normally; the rows it created."""
    connections.close_all()
    wait_until(lambda: not SyncLock.objects.held().exists(), timeout=TTL * 5, what="the old lease to run out")
    following = procs.manage("sync_contests", "--tick", TICK_2, env=env, name="next tick")
    assert following.wait(timeout=60) == 0, following.transcript()
    assert following.result()["outcome"] == "succeeded", following.transcript()
    assert "Traceback" not in following.stderr
    return int(following.field("created"))


@pytest.mark.slow
@pytest.mark.scenario("db-stop-during-sync")
def test_postgres_stopped_during_a_sync(pg_server, fault_env, standin, gate, procs, observe):
    standin.hook = gate  # the fetch lasts until the database is gone
    env = fault_env(SYNC_CONTESTS_LOCK_TTL=str(TTL))
    holder = procs.manage("sync_contests", "--tick", TICK_1, env=env, name="holder")
    wait_until(lambda: gate.arrived, timeout=60, what="the holder to start fetching")

    pg_server.stop()
    holder.wait_for(r"WARNING .*heartbeat", timeout=60)
    gate.open()
    code = holder.wait(timeout=90)
    pg_server.start()

    assert "Traceback" not in holder.stderr, holder.transcript()
    assert code == 1, holder.transcript()
    # The heartbeat noticed during the fetch: the job stops before its next query
    # instead of failing on one.
    assert holder.result()["outcome"] == "lost_lock"
    assert "heartbeat could not renew the lease" in holder.stderr
    assert len(errors(holder.stderr)) == 1, holder.transcript()
    assert warnings(holder.stderr), holder.transcript()
    connections.close_all()
    assert Contest.objects.count() == 0
    created = sync_after_restart(procs, env)
    assert created == 1758
    outcome = holder.result()["outcome"]
    observe(
        f"exit {code}, outcome={outcome}, {len(warnings(holder.stderr))} WARNING + 1 ERROR line, "
        f"no traceback, 0 rows written; after restart the next tick created {created}"
    )


@pytest.mark.slow
@pytest.mark.scenario("db-stop-during-acquire")
def test_postgres_stopped_while_a_copy_tries_to_acquire(pg_server, postgres, fault_env, procs, observe):
    """Before issue 17 a copy's compare-and-set waited on a locked row until the server went
    away; now it never waits (docs/architecture.md, "The rules": 11)."""
    env = fault_env(SYNC_CONTESTS_LOCK_TTL=str(TTL))
    first = procs.manage("sync_contests", "--tick", TICK_0, env=env, name="first sync")
    assert first.wait(timeout=60) == 0, first.transcript()

    # Another session holds the lock row, as a holder's write transaction does.
    blocker = psycopg.connect(postgres, connect_timeout=5)
    blocker.execute(f"SELECT 1 FROM {SyncLock._meta.db_table} WHERE job_name = 'sync_contests' FOR UPDATE")
    try:
        locked = procs.manage("sync_contests", "--tick", TICK_1, env=env, name="copy on the locked row")
        locked_code = locked.wait(timeout=60)
    finally:
        blocker.close()
    assert "Traceback" not in locked.stderr, locked.transcript()
    assert locked_code == 0, locked.transcript()
    assert locked.result()["outcome"] == "skipped", locked.transcript()
    assert "the lock row is locked by a write in progress" in locked.stdout, locked.transcript()
    reason = re.search(r"reason=(.*?) duration=", locked.stdout).group(1)

    pg_server.stop()
    try:
        copy = procs.manage("sync_contests", "--tick", TICK_1, env=env, name="copy, server stopped")
        code = copy.wait(timeout=60)
    finally:
        pg_server.start()

    assert "Traceback" not in copy.stderr, copy.transcript()
    assert code == 0, copy.transcript()
    assert copy.result()["outcome"] == "skipped"
    lines = warnings(copy.stderr)
    assert len(lines) == 1, copy.transcript()
    assert "job=sync_contests" in lines[0]
    assert "reason=database unreachable: OperationalError" in lines[0]
    assert not errors(copy.stderr)
    created = sync_after_restart(procs, env)
    assert created == 0  # the first sync stored them all; nothing was lost
    assert Contest.objects.count() == 1758
    cause = re.search(r"OperationalError: (.*?)(?: CONTEXT:| duration=|$)", lines[0]).group(1)
    observe(
        f"the copy on the locked row: exit 0, skipped at once (`{reason}`); the copy with "
        f"the server stopped: exit 0, one WARNING (job=sync_contests … database unreachable: {cause}), no "
        "traceback; after restart the next tick synced (1758 unchanged)"
    )


@pytest.mark.slow
@pytest.mark.scenario("db-silent")
def test_database_that_accepts_and_never_answers(procs, observe):
    server = SilentServer()
    try:
        env = project_env(
            DATABASE_URL=f"postgres://postgres@127.0.0.1:{server.port}/contests",
            CODEFORCES_API_URL="http://127.0.0.1:9/api",  # never reached: no lease, no fetch
        )
        started = time.monotonic()
        copy = procs.manage("sync_contests", env=env, name="copy")
        code = copy.wait(timeout=60)  # hang guard; the command's own timeout is 5 s
        elapsed = time.monotonic() - started
        accepted = len(server.accepted)
    finally:
        server.close()

    assert accepted >= 1  # TCP was accepted: this is a silent server, not a refused port
    assert "Traceback" not in copy.stderr, copy.transcript()
    assert code == 0, copy.transcript()
    assert copy.result()["outcome"] == "skipped"
    lines = warnings(copy.stderr)
    assert len(lines) == 1, copy.transcript()
    assert "job=sync_contests" in lines[0]
    assert "database unreachable" in lines[0]
    assert "timeout" in lines[0].lower()
    observe(
        f"exited {elapsed:.1f} s after start ({accepted} TCP connection(s) accepted, never answered): "
        "exit 0, one WARNING `database unreachable … timeout expired`, no traceback"
    )
