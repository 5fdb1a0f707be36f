"""What the lease API costs the database per call, counted as assertNumQueries
counts (issue 6; latencies are in docs/benchmarks.md, made by ``make bench``).

The happy path is the steady state: the job's row exists and the lease is free.
Autocommit, as in production (``transaction=True``), so nothing is hidden
inside a test's transaction.
"""

from datetime import UTC, datetime, timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext

from locks import api

pytestmark = pytest.mark.django_db(transaction=True)

JOB, TTL = "statements", timedelta(minutes=5)
TICK = datetime(2030, 1, 1, tzinfo=UTC)


def verbs(queries) -> list[str]:
    return [q["sql"].split(None, 1)[0].upper() for q in queries]


@pytest.fixture
def free_row():
    """The job's row exists and its lease is free (a previous tick ran and released)."""
    lease = api.acquire(job=JOB, tick=TICK - timedelta(hours=1), ttl=TTL)
    assert isinstance(lease, api.Lease)
    assert api.release(lease=lease, status="succeeded")


@pytest.mark.usefixtures("free_row")
@pytest.mark.parametrize("tick", [TICK, None], ids=["scheduled", "forced"])
def test_acquire_and_release_are_one_statement_each_on_the_happy_path(settings, tick):
    settings.LOCKS_USE_RETURNING = True
    if connection.vendor not in {"sqlite", "postgresql"}:
        pytest.skip(
            f"UPDATE … RETURNING is the SQL backends' path; {connection.vendor} takes the portable one"
        )

    with CaptureQueriesContext(connection) as acquiring:
        lease = api.acquire(job=JOB, tick=tick, ttl=TTL)
    with CaptureQueriesContext(connection) as releasing:
        released = api.release(lease=lease, status="succeeded")

    assert isinstance(lease, api.Lease) and lease.token == 2
    assert released
    assert verbs(acquiring) == ["UPDATE"], [q["sql"] for q in acquiring]
    assert "RETURNING" in acquiring[0]["sql"]
    assert verbs(releasing) == ["UPDATE"], [q["sql"] for q in releasing]


@pytest.mark.usefixtures("free_row")
def test_renew_is_one_statement():
    lease = api.acquire(job=JOB, tick=TICK, ttl=TTL)

    with CaptureQueriesContext(connection) as renewing:
        lease.renew()

    assert verbs(renewing) == ["UPDATE"]


@pytest.mark.usefixtures("free_row")
def test_the_portable_path_acquires_in_an_update_and_a_read(settings):
    """Backends without RETURNING (MongoDB) read their token back: two statements."""
    settings.LOCKS_USE_RETURNING = False

    with CaptureQueriesContext(connection) as acquiring:
        lease = api.acquire(job=JOB, tick=TICK, ttl=TTL)
    with CaptureQueriesContext(connection) as releasing:
        assert api.release(lease=lease, status="succeeded")

    assert isinstance(lease, api.Lease) and lease.token == 2
    assert verbs(acquiring) == ["UPDATE", "SELECT"]
    assert verbs(releasing) == ["UPDATE"]


@pytest.mark.usefixtures("free_row")
def test_a_loser_learns_why_in_two_statements(settings):
    settings.LOCKS_USE_RETURNING = True
    holder = api.acquire(job=JOB, tick=TICK, ttl=TTL)
    assert isinstance(holder, api.Lease)

    with CaptureQueriesContext(connection) as losing:
        skip = api.acquire(job=JOB, tick=TICK, ttl=TTL)

    assert isinstance(skip, api.Skip) and skip.reason == "held"
    # The compare-and-set that matched nothing, then one read of who holds it.
    assert verbs(losing) == ["UPDATE", "SELECT"]


@pytest.mark.parametrize("tick", [TICK, None], ids=["scheduled", "forced"])
def test_the_reused_acquire_statement_is_the_one_django_compiles(tick):
    """acquire() compiles its UPDATE once per shape and reuses it with the real
    holder and tick put back: the result must equal a fresh compilation."""
    db = "default"
    api._acquire_templates.clear()
    first = api._acquire_sql(db=db, job=JOB, tick=tick, ttl=TTL, holder="host:1:aaaaaa")
    for holder, when in [
        ("host:2:bbbbbb", TICK + timedelta(hours=5)),
        ("other:3:cccccc", TICK + timedelta(days=9)),
    ]:
        when = None if tick is None else when
        reused = api._acquire_sql(db=db, job=JOB, tick=when, ttl=TTL, holder=holder)
        fresh = api._compile_update(*api._acquire_update(db=db, job=JOB, tick=when, ttl=TTL, holder=holder))
        assert reused == fresh
    assert first[0] == reused[0]
    assert api._acquire_templates[(db, JOB, tick is None, TTL, True)] is not None


@pytest.mark.usefixtures("free_row")
def test_reused_statements_still_compare_and_set_on_the_tick(settings):
    settings.LOCKS_USE_RETURNING = True
    later = TICK + timedelta(hours=2)
    won = api.acquire(job=JOB, tick=later, ttl=TTL, holder="a:1:aaaaaa")
    assert isinstance(won, api.Lease) and api.release(lease=won, status="succeeded")

    earlier = api.acquire(job=JOB, tick=TICK, ttl=TTL, holder="b:2:bbbbbb")
    again = api.acquire(job=JOB, tick=later, ttl=TTL, holder="c:3:cccccc")
    latest = api.acquire(job=JOB, tick=later + timedelta(hours=1), ttl=TTL, holder="d:4:dddddd")

    assert isinstance(earlier, api.Skip) and earlier.reason == "tick_claimed"
    assert isinstance(again, api.Skip) and again.reason == "tick_claimed"
    assert isinstance(latest, api.Lease) and latest.token == won.token + 1
    row = api.SyncLock.objects.get(job_name=JOB)
    assert (row.holder, row.tick, row.token) == ("d:4:dddddd", later + timedelta(hours=1), latest.token)
