"""Exactly once across a PostgreSQL failover, on two real clusters (docs/faults.md, "Failover").

Each test makes a primary from a migrated template, a ``pg_basebackup -R`` standby fed through a
link relay that can freeze, and points the copies (``tests.locks.worker`` processes) at an app
relay that is switched to the standby once it is promoted (``tests/faults/replication.py``).
"""

from __future__ import annotations

import json
import shutil
import sys
import time
from datetime import UTC, datetime, timedelta

import pytest

from tests.conftest import manage, project_env
from tests.faults.conftest import unavailable
from tests.faults.replication import Pair, make_template, unavailable_reason, workdir

pytestmark = pytest.mark.slow

NOW = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
EARLIER, TICK = NOW - timedelta(hours=2), NOW - timedelta(hours=1)  # hourly slots in the ledger window
FAILED_OVER = "the database failed over since token {token} was granted on timeline 1 (now timeline 2"


@pytest.fixture(scope="session")
def template():
    reason = unavailable_reason()
    if reason:
        unavailable(reason)
    root = workdir()

    def migrate(url: str) -> None:
        done = manage("migrate", "--noinput", "-v", "0", env=project_env(DATABASE_URL=url), timeout=180)
        assert done.returncode == 0, done.stderr

    try:
        yield make_template(root, migrate=migrate)
    finally:
        shutil.rmtree(root, ignore_errors=True)


@pytest.fixture
def pair(postgres, template):
    made: list[Pair] = []

    def create(**options) -> Pair:
        made.append(Pair.create(template, **options))
        return made[-1]

    try:
        yield create
    finally:
        for each in made:
            each.destroy()


def worker(procs, url: str, job: str, tick: datetime, *extra: str, ttl: float = 30):
    argv = [sys.executable, "-m", "tests.locks.worker", "--job", job, "--tick", tick.isoformat()]
    argv += ["--ttl", str(ttl), *extra]
    return procs.start(argv, env=project_env(DATABASE_URL=url, LOCKS_LOG_LEVEL="INFO"), name=f"worker {job}")


def outcome(proc, *, timeout: float = 30) -> dict:
    assert proc.wait(timeout=timeout) == 0, proc.transcript()
    return json.loads(proc.stdout_lines[-1])


def acquired(proc, *, timeout: float = 20) -> None:
    proc.wait_for(r'"outcome": "acquired"', timeout=timeout, stream="stdout")


def lock_row(cluster, job: str) -> tuple:
    return cluster.query(
        "SELECT token, tick, tick_done, committed_token, last_status, timeline FROM locks_synclock "
        "WHERE job_name = %s",
        (job,),
    )[0]


def runs(cluster, job: str) -> list[tuple]:
    return cluster.query(
        "SELECT token, tick, status, timeline, failover, error FROM locks_jobrun WHERE job_name = %s "
        "ORDER BY started_at",
        (job,),
    )


@pytest.mark.scenario("failover-write-lost")
def test_a_fenced_write_lost_with_the_old_primary_is_failed_never_succeeded(pair, procs, tmp_path, observe):
    """The worst case: the fenced write commits on the old primary only (the link frozen), and the
    run's release lands on the promoted standby. It is recorded failed there, the tick left open;
    the next run of that tick warns of the failover and marks its run."""
    servers = pair()
    hold = tmp_path / "hold"
    first = worker(procs, servers.url, "sync", TICK, "--hold", str(hold), "--then", "8")
    acquired(first)
    servers.wait_replayed()  # the lease and the run's start are on the standby too
    servers.link.freeze()
    hold.touch()
    first.wait_for(r'"outcome": "committed"', timeout=20, stream="stdout")
    assert lock_row(servers.primary, "sync")[2:4] == (True, 1)  # committed on the old primary
    servers.fail_over()

    result = outcome(first)
    new = servers.standby
    assert result["outcome"] == "failed", first.transcript()
    assert result["error"] == "its fenced write (token 1) is not in this database's history"
    token, tick, done, committed, status, _timeline = lock_row(new, "sync")
    assert (token, tick, done, committed, status) == (1, TICK, False, None, "failed")
    assert [run[:3] for run in runs(new, "sync")] == [(1, TICK, "failed")]

    again = outcome(worker(procs, servers.url, "sync", TICK, "--write", "0.1"))
    assert (again["outcome"], again["token"], again["timeline"]) == ("succeeded", 2, 2), again
    warnings = [line for line in procs.started[-1].stderr_lines if " WARNING " in line]
    assert len(warnings) == 1 and FAILED_OVER.format(token=1) in warnings[0], warnings
    assert lock_row(new, "sync")[:6] == (2, TICK, True, 2, "succeeded", 2)
    second = runs(new, "sync")[-1]
    assert (second[0], second[2], second[3]) == (2, "succeeded", 2)
    assert FAILED_OVER.format(token=1) in second[4]
    observe(
        "the fenced write committed on the old primary only, the release landed on the promoted standby: "
        f"recorded `failed` ({result['error']}), tick open, committed_token NULL; the next run (token 2, "
        "timeline 2) warned once of the failover, its JobRun marked, and succeeded"
    )


@pytest.mark.scenario("failover-async-repeat")
def test_a_tick_run_again_after_an_async_failover_is_warned_of_and_marked(pair, procs, observe):
    """Asynchronous replication, the link frozen: a tick runs to its end on the primary, which then
    dies. On the promoted standby the tick is open again and runs again (the repeat asynchronous
    replication allows), but not silently: one WARNING, the run marked in the ledger. A job whose
    ``on_failover`` is "pause" is paused instead of running."""
    servers = pair()
    for job in ("sync_contests", "send_reminders"):
        assert outcome(worker(procs, servers.url, job, EARLIER, "--write", "0.1"))["outcome"] == "succeeded"
    servers.wait_replayed()
    servers.link.freeze()
    for job in ("sync_contests", "send_reminders"):
        assert outcome(worker(procs, servers.url, job, TICK, "--write", "0.1"))["outcome"] == "succeeded"
    # A second slot lost with the primary (the link stays frozen): it too is named when it runs again.
    assert (
        outcome(worker(procs, servers.url, "sync_contests", NOW, "--write", "0.1"))["outcome"] == "succeeded"
    )
    assert lock_row(servers.primary, "sync_contests")[:3] == (3, NOW, True)
    servers.fail_over()
    new = servers.standby
    assert lock_row(new, "sync_contests")[:3] == (
        1,
        EARLIER,
        True,
    )  # the run of TICK is gone with the primary

    repeat = worker(procs, servers.url, "sync_contests", TICK, "--write", "0.1")
    result = outcome(repeat)
    assert (result["outcome"], result["token"], result["timeline"]) == ("succeeded", 2, 2), result
    warnings = [line for line in repeat.stderr_lines if " WARNING " in line]
    assert len(warnings) == 1 and FAILED_OVER.format(token=1) in warnings[0], warnings
    [(token, _tick, status, timeline, failover, _error)] = [
        run for run in runs(new, "sync_contests") if run[1] == TICK
    ]
    assert (token, status, timeline) == (2, "succeeded", 2) and FAILED_OVER.format(token=1) in failover
    second = worker(procs, servers.url, "sync_contests", NOW, "--write", "0.1")
    assert (outcome(second)["token"], outcome(second)["timeline"]) == (3, 2)
    [warning] = [line for line in second.stderr_lines if " WARNING " in line]
    assert f"tick {NOW.isoformat()} is at or before the failover: " + FAILED_OVER.format(token=1) in warning
    ledger = manage("locks", "ticks", "sync_contests", "--json", env=project_env(DATABASE_URL=servers.url))
    assert ledger.returncode == 0, ledger.stderr
    slots = {slot["tick"]: slot for slot in json.loads(ledger.stdout)}
    for tick in (TICK, NOW):  # each slot lost with the primary is named, not only the first
        slot = slots[tick.isoformat()]
        assert slot["outcome"] == "succeeded" and FAILED_OVER.format(token=1) in slot["failover"], slot
    assert not slots[EARLIER.isoformat()]["failover"]  # replicated before the freeze: ran once

    paused = worker(procs, servers.url, "send_reminders", TICK, "--write", "0.1", "--on-failover", "pause")
    held = outcome(paused)
    assert held["outcome"] == "failed" and "paused on a database failover" in held["error"], held
    [(paused_by, note)] = new.query(
        "SELECT paused_by, paused_note FROM locks_synclock WHERE job_name = 'send_reminders'"
    )
    assert paused_by == "locks:failover" and FAILED_OVER.format(token=1) in note
    assert not new.query("SELECT 1 FROM locks_jobrun WHERE job_name = 'send_reminders' AND status = 'succeeded' "
                         "AND tick = %s", (TICK,))  # fmt: skip
    observe(
        "link frozen, two ticks ran on the primary, primary killed, standby promoted: both ran again "
        "(tokens 2 and 3 on timeline 2), with one WARNING `the database failed over since token 1 was granted on "
        "timeline 1`, one more naming the second slot `at or before the failover`, and both JobRuns and ledger "
        "slots marked; a job with on_failover=pause was paused (by locks:failover) "
        "instead of running"
    )


@pytest.mark.scenario("failover-standby")
def test_a_standby_in_recovery_is_its_own_skip_reason_and_a_multi_host_url_finds_the_primary(
    pair, procs, observe
):
    servers = pair()
    standby = f"postgres://postgres@127.0.0.1:{servers.standby.port}/contests"
    refused = outcome(worker(procs, standby, "sync", TICK, "--write", "0.1"))
    assert refused["outcome"] == "skipped", refused
    assert refused["reason"].startswith("the database is a standby in recovery: "), refused
    assert "session is read-only" in refused["reason"]
    read_only = outcome(worker(procs, standby + "?target_session_attrs=any", "sync", TICK, "--write", "0.1"))
    assert read_only["reason"].startswith("the database is a standby in recovery: "), read_only
    assert "read-only transaction" in read_only["reason"]
    status = manage("locks", "status", env=project_env(DATABASE_URL=standby))
    assert status.returncode == 1 and "the database is a standby in recovery" in status.stderr

    both = f"postgres://postgres@127.0.0.1:{servers.standby.port},127.0.0.1:{servers.primary.port}/contests"
    found = outcome(worker(procs, both, "sync", TICK, "--write", "0.1"))
    assert (found["outcome"], found["timeline"]) == ("succeeded", 1), found
    observe(
        f"pointed at the standby: skipped `{refused['reason'][:60]}…`; with target_session_attrs=any: "
        f"`{read_only['reason'][:40]}… read-only transaction`; `locks status` says so; a URL naming standby "
        "and primary found the primary and ran"
    )


@pytest.mark.scenario("failover-sync")
def test_with_a_synchronous_standby_a_failover_loses_no_acknowledged_tick(pair, procs, observe):
    servers = pair(synchronous=True)
    assert outcome(worker(procs, servers.url, "sync", TICK, "--write", "0.1"))["outcome"] == "succeeded"
    servers.fail_over()
    again = outcome(worker(procs, servers.url, "sync", TICK, "--write", "0.1"))
    assert (again["outcome"], again["skip"]) == ("skipped", "tick_claimed"), again
    assert [run[:3] for run in runs(servers.standby, "sync")] == [(1, TICK, "succeeded")]
    observe(
        "synchronous standby: the tick that succeeded on the old primary is done on the new one; 0 repeats"
    )


def cancel_sync_waits(cluster, *, until, timeout: float) -> int:
    """Cancel every backend waiting for the synchronous standby (what an operator or a pooler does)
    until ``until()``; how many were cancelled."""
    cancelled = 0
    deadline = time.monotonic() + timeout
    while not until() and time.monotonic() < deadline:
        cancelled += cluster.one(
            "SELECT count(pg_cancel_backend(pid)) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
        )
        time.sleep(0.2)
    return cancelled


@pytest.mark.scenario("failover-sync-cancelled")
def test_a_commit_whose_wait_for_the_synchronous_standby_is_cancelled_is_unknown(
    pair, procs, tmp_path, observe
):
    """The standby away, the fenced COMMIT waits for it; its wait is cancelled ("canceling wait for
    synchronous replication… already committed locally"). The run is unknown, not succeeded; after a
    failover that lost it the tick runs again and the lost run is named."""
    servers = pair(synchronous=True)
    hold = tmp_path / "hold"
    first = worker(procs, servers.url, "sync", TICK, "--hold", str(hold), "--write", "0.1", ttl=4)
    acquired(first)
    servers.link.freeze()
    hold.touch()
    cancelled = cancel_sync_waits(servers.primary, until=lambda: first.popen.poll() is not None, timeout=25)
    result = outcome(first)
    assert cancelled >= 1
    assert result["outcome"] == "unknown", first.transcript()
    assert (
        "without its synchronous standby's confirmation (canceling wait for synchronous replication"
        in (result["error"])
    )
    servers.fail_over()
    time.sleep(4)  # the lease (TTL 4 s) the standby saw granted runs out
    again = outcome(worker(procs, servers.url, "sync", TICK, "--write", "0.1"))
    assert (again["outcome"], again["token"], again["timeline"]) == ("succeeded", 2, 2), again
    lost, rerun = runs(servers.standby, "sync")
    assert (lost[0], lost[2]) == (1, "abandoned") and "was lost in a failover" in lost[5], lost
    assert (rerun[0], rerun[2]) == (2, "succeeded") and FAILED_OVER.format(token=1) in rerun[4]
    observe(
        f"standby away, {cancelled} commit wait(s) cancelled: the run was `unknown` (not succeeded); after "
        "the failover the tick ran again (token 2), the lost run recorded abandoned (lost in a failover)"
    )


@pytest.mark.scenario("failover-sync-first-insert")
def test_the_first_insert_of_a_lock_row_waits_a_bounded_time_behind_another(pair, procs, observe):
    """The standby away: a job's first-ever INSERT waits for it at its COMMIT; a second copy's INSERT
    of the same row waits on the unique index behind it, and gives up within its lock_timeout."""
    servers = pair(synchronous=True)
    servers.link.freeze()
    first = worker(procs, servers.url, "fresh", TICK, "--write", "0.1")
    servers_waits = lambda: servers.primary.one(  # noqa: E731
        "SELECT count(*) FROM pg_stat_activity WHERE wait_event = 'SyncRep'"
    )
    deadline = time.monotonic() + 20
    while not servers_waits() and time.monotonic() < deadline:
        time.sleep(0.1)
    started = time.monotonic()
    second = outcome(worker(procs, servers.url, "fresh", TICK, "--write", "0.1"), timeout=25)
    took = time.monotonic() - started
    assert (second["outcome"], second["skip"]) == ("skipped", "held"), second
    assert "locked by a write in progress" in second["reason"]
    servers.link.thaw()
    assert outcome(first)["outcome"] == "succeeded"
    observe(
        f"standby away: the first copy's INSERT waited for it; the second gave up on the row after {took:.1f} s "
        "(lock_timeout 5 s, skipped `held`); once the link thawed the first ran"
    )
