"""A COMMIT whose answer is lost: the run finds out from the lock row (docs/architecture.md, rule 10).

A loopback proxy in front of PostgreSQL (``tests/faults/pgproxy.py``) cuts the connection of
the run's fenced transaction at its COMMIT: after the server committed (the answer is lost), or
before the COMMIT reached it (the server rolls back). The client sees the same error both
times; only reading the row back tells them apart.
"""

from __future__ import annotations

import json
import sys
from datetime import UTC, datetime

import environ
import pytest

from locks.models import JobRun, SyncLock
from tests.conftest import database_url, project_env
from tests.faults.pgproxy import PgProxy

TICK = datetime(2026, 11, 30, 14, 0, tzinfo=UTC)

pytestmark = pytest.mark.slow

# The fenced write's own renewal: no other statement of a run sets this column.
FENCED_RENEWAL = b'"committed_token" = '


@pytest.fixture
def proxy(postgres):
    config = environ.Env.db_url_config(postgres)
    server = PgProxy((config["HOST"], config["PORT"] or 5432)).start()
    server.url = database_url(config, port=server.port)
    try:
        yield server
    finally:
        server.stop()


def worker(procs, url: str, *extra: str):
    args = ["-m", "tests.locks.worker", "--job", "cut", "--tick", TICK.isoformat(), "--ttl", "30", *extra]
    return procs.start([sys.executable, *args], env=project_env(DATABASE_URL=url, LOCKS_LOG_LEVEL="INFO"))


def outcome(proc) -> dict:
    assert proc.wait(timeout=120) == 0, proc.transcript()
    return json.loads(proc.stdout_lines[-1])


@pytest.mark.scenario("commit-answer-lost")
def test_a_commit_whose_answer_is_lost_is_read_back_and_the_tick_never_runs_twice(procs, proxy, observe):
    proxy.cut_commits(marker=FENCED_RENEWAL, mode="after")

    first = worker(procs, proxy.url, "--write", "0.1")
    result = outcome(first)

    assert proxy.cut == 1
    assert (result["outcome"], result["error"]) == ("succeeded", ""), first.transcript()
    [warning] = [line for line in first.stderr_lines if " WARNING " in line]
    assert "the COMMIT of its fenced write got no answer" in warning
    assert warning.endswith("the lock row says it committed"), warning
    assert "Traceback" not in first.stderr
    lock = SyncLock.objects.get(job_name="cut")
    assert (lock.tick, lock.tick_done, lock.committed_token, lock.last_status) == (TICK, True, 1, "succeeded")

    second = outcome(worker(procs, proxy.url, "--write", "0.1"))
    assert (second["outcome"], second["skip"]) == ("skipped", "tick_claimed")
    runs = list(JobRun.objects.filter(job_name="cut").values_list("tick", "status"))
    assert runs == [(TICK, "succeeded")]
    observe(
        f"the answer of 1 COMMIT dropped: exit 0, outcome=succeeded, WARNING `{warning.split(' token=1 ')[1]}`; "
        f"tick done; the second run skipped ({second['reason']}); 1 JobRun, succeeded"
    )


@pytest.mark.scenario("commit-lost")
def test_a_commit_that_never_reached_the_server_fails_and_the_tick_is_retried(procs, proxy, observe):
    proxy.cut_commits(marker=FENCED_RENEWAL, mode="before")

    first = worker(procs, proxy.url, "--write", "0.1")
    assert first.wait(timeout=120) == 0, first.transcript()
    result = json.loads(first.stdout_lines[-1])

    assert proxy.cut == 1
    assert result["outcome"] == "failed", first.transcript()
    assert result["error"].startswith("database error: "), result
    assert any(line.endswith("the lock row says it did not commit") for line in first.stderr_lines)
    assert "Traceback" not in first.stderr
    lock = SyncLock.objects.get(job_name="cut")
    assert (lock.tick, lock.tick_done, lock.committed_token, lock.last_status) == (
        TICK,
        False,
        None,
        "failed",
    )

    second = outcome(worker(procs, proxy.url, "--write", "0.1"))
    assert second["outcome"] == "succeeded"
    runs = list(JobRun.objects.filter(job_name="cut").order_by("token").values_list("token", "status"))
    assert runs == [(1, "failed"), (2, "succeeded")]
    observe(
        "1 COMMIT dropped before the server: exit 0 from the worker, outcome=failed (`"
        f"{result['error'][:60]}…`), the row says it did not commit; tick open; the next run succeeded "
        "(token 2); JobRuns failed, succeeded"
    )


# The read-back's own statement (read_back_commit's read through locks.db.unlocked):
# the one SELECT that takes the row FOR UPDATE NOWAIT (an UPDATE through db.unlocked has no ORDER BY).
READ_BACK = b"FOR UPDATE NOWAIT)) ORDER BY"


@pytest.mark.scenario("commit-unknown")
def test_a_commit_that_cannot_be_read_back_is_unknown_until_the_next_run_resolves_it(procs, proxy, observe):
    """It was recorded `failed` for good before, though the row showed the write committed: the
    ledger showed the slot failed and check_jobs counted it (issue 25)."""
    proxy.cut_commits(marker=FENCED_RENEWAL, mode="after")
    proxy.drop_statements(READ_BACK)  # every read-back of the row fails: the outcome stays unknown

    first = worker(procs, proxy.url, "--write", "0.1", "--ttl", "3")
    result = outcome(first)

    assert (proxy.cut, result["outcome"]) == (1, "unknown"), first.transcript()
    assert result["error"].startswith("outcome unknown: the COMMIT of the fenced write of cut (token 1)")
    assert proxy.dropped >= 2  # fenced's read-back, then the run's own before it is recorded
    assert "Traceback" not in first.stderr
    [run] = JobRun.objects.filter(job_name="cut")
    assert run.status == "unknown"
    lock = SyncLock.objects.get(job_name="cut")
    assert (lock.tick_done, lock.committed_token, lock.last_status) == (True, 1, "unknown")

    proxy.drop_statements(None)
    second = outcome(worker(procs, proxy.url, "--write", "0.1"))

    assert (second["outcome"], second["skip"]) == ("skipped", "tick_claimed")  # the write had committed
    run.refresh_from_db()
    assert run.status == "unknown"  # a skip takes no lease: the next run that takes one resolves it
    args = ["-m", "tests.locks.worker", "--job", "cut", "--ttl", "30"]  # no --tick: a forced run
    forced = outcome(procs.start([sys.executable, *args], env=project_env(DATABASE_URL=proxy.url)))
    assert forced["outcome"] == "succeeded", forced
    run.refresh_from_db()
    assert (run.status, run.error) == (
        "succeeded",
        "resolved by token 2: the lock row shows its fenced write committed",
    )
    observe(
        f"COMMIT answer dropped and {proxy.dropped} read-backs cut: outcome=unknown (exit 1), JobRun unknown, "
        "tick done; the next run skipped the slot (done); the next lease resolved the run as succeeded"
    )
