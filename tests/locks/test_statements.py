"""What the lease API costs the database per call, counted as assertNumQueries
counts (latencies are in docs/benchmarks.md, made by ``make bench``).

The happy path is the steady state: the job's row exists and the lease is free.
Autocommit, as in production (``transaction=True``), so nothing is hidden
inside a test's transaction.
"""

import re
from datetime import UTC, datetime, timedelta
from itertools import cycle

import pytest
from django.db import connection, transaction
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from locks.lease import Held, Lease, Skip, _won, acquire, release, renew, renew_all
from locks.models import JobRun, SyncLock
from locks.operator import force_release
from locks.runner import run_locked
from tests.locks.conftest import register

pytestmark = pytest.mark.django_db(transaction=True)

JOB, TTL = "statements", timedelta(minutes=5)
TICK = datetime(2030, 1, 1, tzinfo=UTC)


def verbs(queries) -> list[str]:
    return [q["sql"].split(None, 1)[0].upper() for q in queries]


@pytest.fixture
def free_row():
    """The job's row exists and its lease is free (a previous tick ran and released)."""
    lease = acquire(job=JOB, tick=TICK - timedelta(hours=1), ttl=TTL)
    assert isinstance(lease, Lease)
    assert release(lease=lease, status="succeeded")


@pytest.mark.usefixtures("free_row")
@pytest.mark.parametrize("tick", [TICK, None], ids=["scheduled", "forced"])
def test_acquire_and_release_take_two_statements_on_the_happy_path(tick):
    with CaptureQueriesContext(connection) as acquiring:
        lease = acquire(job=JOB, tick=tick, ttl=TTL)
    with CaptureQueriesContext(connection) as releasing:
        released = release(lease=lease, status="succeeded")

    assert isinstance(lease, Lease) and lease.token == 2
    assert released
    # The compare-and-set returning the winner's token (UPDATE … RETURNING); it commits by itself (no
    # BEGIN, no COMMIT, no server bound: there is no transaction a frozen process could keep open).
    assert verbs(acquiring) == ["UPDATE"], [q["sql"] for q in acquiring]
    assert " RETURNING " in acquiring[0]["sql"]
    assert verbs(releasing) == ["UPDATE"], [q["sql"] for q in releasing]


@pytest.mark.usefixtures("free_row")
def test_the_claim_returns_the_winners_row_in_its_own_statement_in_autocommit():
    """Issue 36, item 4: the claim and its read were one transaction (BEGIN, the server's bound,
    UPDATE, SELECT, COMMIT), then two statements in autocommit; now one UPDATE … RETURNING: what the
    winner reads is the row its own UPDATE wrote."""
    seen = []

    def record(execute, sql, params, many, context):
        seen.append((sql.split(None, 1)[0].upper(), connection.in_atomic_block))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        lease = acquire(job=JOB, tick=TICK, ttl=TTL)

    assert isinstance(lease, Lease)
    assert seen == [("UPDATE", False)]
    row = SyncLock.objects.get(job_name=JOB)
    assert (lease.token, lease.grant.acquired_at) == (row.token, row.acquired_at)


@pytest.mark.usefixtures("free_row")
def test_inside_a_callers_transaction_acquire_adds_no_savepoint():
    with transaction.atomic(), CaptureQueriesContext(connection) as acquiring:
        lease = acquire(job=JOB, tick=TICK, ttl=TTL)

    assert isinstance(lease, Lease)
    assert verbs(acquiring) == ["UPDATE"], [q["sql"] for q in acquiring]


@pytest.mark.usefixtures("free_row")
def test_renew_is_one_statement():
    """In autocommit: its UPDATE never waits on a locked row (FOR UPDATE NOWAIT in its subquery,
    written by locks.db.unlocked, which Django's select_for_update() refuses outside a transaction)."""
    lease = acquire(job=JOB, tick=TICK, ttl=TTL)

    with CaptureQueriesContext(connection) as renewing:
        renew(lease=lease)

    assert verbs(renewing) == ["UPDATE"]


def test_a_scheduler_renews_the_leases_of_all_its_workers_in_one_statement():
    """Issue 36, item 4: one heartbeat statement renews every lease a replica's runs hold, each by
    its own TTL from the database's now; a lease that was lost costs a second (the read of why)."""
    leases = [acquire(job=f"{JOB}-{n}", tick=TICK, ttl=TTL * (n + 1)) for n in range(3)]
    rows = SyncLock.objects.filter(job_name__startswith=f"{JOB}-").order_by("job_name")
    rows.update(locked_until=F("locked_until") - timedelta(seconds=1))  # then renewed: TTL after the beat
    held = [Held(lease.job, lease.token, lease.ttl, lease.grant.timeline) for lease in leases]

    with CaptureQueriesContext(connection) as renewing:
        lost = renew_all(held)

    assert lost == {}
    assert verbs(renewing) == ["UPDATE"], [q["sql"] for q in renewing]
    for lease, (until, beat) in zip(leases, rows.values_list("locked_until", "heartbeat_at"), strict=True):
        assert until - beat == lease.ttl
    assert force_release(job=f"{JOB}-1", by="test").changed

    with CaptureQueriesContext(connection) as renewing:
        lost = renew_all(held)

    assert lost == {held[1]: f"lease on {JOB}-1 (token 1) was taken over, released or expired"}
    assert verbs(renewing) == ["UPDATE", "SELECT"], [q["sql"] for q in renewing]


@pytest.mark.usefixtures("free_row")
def test_a_loser_learns_why_in_two_statements():
    holder = acquire(job=JOB, tick=TICK, ttl=TTL)
    assert isinstance(holder, Lease)

    with CaptureQueriesContext(connection) as losing:
        skip = acquire(job=JOB, tick=TICK, ttl=TTL)

    assert isinstance(skip, Skip) and skip.reason == "held"
    # The compare-and-set that matched nothing, then one read of who holds it.
    assert verbs(losing) == ["UPDATE", "SELECT"]


@pytest.mark.usefixtures("free_row")
def test_the_compare_and_set_refuses_a_claimed_or_earlier_tick():
    later = TICK + timedelta(hours=2)
    won = acquire(job=JOB, tick=later, ttl=TTL, holder="a:1:aaaaaa")
    assert isinstance(won, Lease) and release(lease=won, status="succeeded")

    earlier = acquire(job=JOB, tick=TICK, ttl=TTL, holder="b:2:bbbbbb")
    again = acquire(job=JOB, tick=later, ttl=TTL, holder="c:3:cccccc")
    latest = acquire(job=JOB, tick=later + timedelta(hours=1), ttl=TTL, holder="d:4:dddddd")

    assert isinstance(earlier, Skip) and earlier.reason == "tick_claimed"
    assert isinstance(again, Skip) and again.reason == "tick_claimed"
    assert isinstance(latest, Lease) and latest.token == won.token + 1
    row = SyncLock.objects.get(job_name=JOB)
    assert (row.holder, row.tick, row.token) == ("d:4:dddddd", later + timedelta(hours=1), latest.token)


def test_acquire_works_without_time_zone_support(settings):
    """USE_TZ=False: naive datetimes everywhere, the tick included."""
    settings.USE_TZ = False
    tick = datetime(2030, 1, 1, 14, 0)

    lease = acquire(job=JOB, tick=tick, ttl=TTL, holder="a:1:aaaaaa")
    skip = acquire(job=JOB, tick=tick + timedelta(hours=1), ttl=TTL, holder="b:2:bbbbbb")

    assert isinstance(lease, Lease) and lease.token == 1
    assert lease.grant.acquired_at.tzinfo is None
    assert isinstance(skip, Skip) and (skip.reason, skip.holder) == ("held", "a:1:aaaaaa")
    assert skip.locked_until - lease.grant.acquired_at == TTL
    assert release(lease=lease, status="succeeded")
    again = acquire(job=JOB, tick=tick, ttl=TTL, holder="c:3:cccccc")
    assert isinstance(again, Skip) and again.reason == "tick_claimed"
    row = SyncLock.objects.get(job_name=JOB)
    assert (row.tick, row.token, row.last_status) == (tick, 1, "succeeded")


NO_OP = {"callable": "tests.jobsapp.jobs.record", "ttl": 300}


def no_op(lease: Lease) -> None:
    return None


@pytest.mark.usefixtures("free_row")
def test_a_winners_no_op_scheduled_run(settings):
    """What Django sends on the run's own connection (CaptureQueriesContext, the BEGIN and COMMIT
    of the lease's transactions included; the heartbeat's connection is another). Issue 36, item 4: before, 12 on
    SQLite and 16 on PostgreSQL: two UPDATEs settled earlier runs (four when a fenced write had
    committed) and a DELETE pruned (in a transaction of its own) on every run; then 12 on PostgreSQL
    (11 on SQLite): one UPDATE settled them on every run, now only when the claim's read saw an
    unsettled one, and the claim and the release were transactions of their own (BEGIN, the server's
    bound, COMMIT), then statements that commit by themselves: 5; now the claim returns its row
    (UPDATE … RETURNING): 4 (MongoDB, with no RETURNING, reads it: 5, tests/test_mongodb.py)."""
    register(settings, **{JOB: {**NO_OP, "schedule": "* * * * *"}})

    with CaptureQueriesContext(connection) as running:
        result = run_locked(job=JOB, tick=TICK, ttl=TTL, fn=no_op)

    assert result.outcome == "succeeded" and result.token == 2  # token 2 of a job every minute: no prune
    assert verbs(running) == [
        "UPDATE",  # the claim, returning its token
        "INSERT",  # this run's row (no earlier run to settle: the claim's read saw none)
        "UPDATE",  # the release
        "UPDATE",  # the run's outcome
    ], [q["sql"] for q in running]


def deletes(run) -> int:
    """The DELETEs of runs that ``run()`` sends."""
    seen = []

    def record(execute, sql, params, many, context):
        seen.append(sql.startswith('DELETE FROM "locks_jobrun"'))
        return execute(sql, params, many, context)

    with connection.execute_wrapper(record):
        run()
    return sum(seen)


@pytest.mark.parametrize(
    ("schedule", "runs", "pruned"),
    [("* * * * *", 60, 1), ("*/20 * * * *", 6, 2), ("0 * * * *", 3, 3), ("0 8 * * *", 2, 2), (None, 2, 2)],
    ids=["every-minute", "every-20-minutes", "hourly", "daily", "not-registered"],
)
def test_runs_prune_about_hourly_by_token(settings, schedule, runs, pruned):
    """Forced runs (tokens 1, 2, …), as scheduled ones: a job every minute prunes at token 60, one
    every 20 minutes at 3 and 6; one an hour or more apart, and run_locked of a name not in
    LOCKS_JOBS, on every run."""
    if schedule:
        register(settings, **{JOB: {**NO_OP, "schedule": schedule}})

    def run_all():
        for _ in range(runs):
            assert run_locked(job=JOB, tick=None, ttl=TTL, fn=no_op).outcome == "succeeded"

    assert deletes(run_all) == pruned
    assert SyncLock.objects.get(job_name=JOB).token == runs


@pytest.mark.usefixtures("free_row")
def test_a_winner_settles_earlier_runs_only_when_one_is_unsettled(settings):
    """The claim's read-back says whether a run of an earlier token still says running; then, and
    only then, one UPDATE settles it before this run's row is inserted."""
    register(settings, **{JOB: {**NO_OP, "schedule": "* * * * *"}})
    JobRun.objects.create(job_name=JOB, tick=TICK, holder="dead:1:aaaaaa", token=1, started_at=TICK)

    with CaptureQueriesContext(connection) as running:
        result = run_locked(job=JOB, tick=TICK, ttl=TTL, fn=no_op)
    with CaptureQueriesContext(connection) as again:
        later = run_locked(job=JOB, tick=TICK + timedelta(minutes=1), ttl=TTL, fn=no_op)

    assert (result.outcome, later.outcome) == ("succeeded", "succeeded")
    assert JobRun.objects.get(token=1).status == "abandoned"
    settled = [q["sql"] for q in running if q["sql"].startswith('UPDATE "locks_jobrun"')]
    assert len(settled) == 2, settled  # the settling, then this run's outcome
    assert len([q for q in again if q["sql"].startswith('UPDATE "locks_jobrun"')]) == 1


def test_the_claims_question_of_unsettled_runs_is_answered_by_an_index():
    """Every claim asks whether a run of an earlier token is unsettled (``JobRunQuerySet.unsettled``):
    by a (job, status, …) index of the runs, locks 0015, not a scan of the job's whole history
    (43,200 runs for a job every minute kept 30 days)."""
    statuses = ["succeeded"] * 8 + ["failed", "abandoned"]  # a history, not one status
    JobRun.objects.bulk_create(
        JobRun(job_name=JOB, tick=TICK, holder="h:1:aaaaaa", token=token, started_at=TICK, status=status)
        for token, status in zip(range(1, 2001), cycle(statuses), strict=False)
    )
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")  # the planner's statistics, as a database in use has them

    plan = _won(SyncLock.objects.for_job(JOB), job=JOB, using=connection.alias).explain()  # the claim's read

    # PostgreSQL may take the (job, status, finished_at) index, whose (job, status) prefix serves as
    # well; SQLite's planner needs the token in it (without it: a SCAN of every run).
    assert re.search(r"jobrun_job_status_(token|finished)", plan), plan
