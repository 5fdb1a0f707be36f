"""Lock semantics 1, 3, 7: one compare-and-set, once per tick, owner-only release."""

from datetime import timedelta

import pytest

from locks import api
from locks.models import SyncLock
from tests.locks.conftest import TICK

TTL = timedelta(minutes=5)
pytestmark = pytest.mark.django_db


def test_first_acquire_creates_the_row_with_token_one():
    lease = api.acquire(job="job", tick=TICK, ttl=TTL, holder="a:1:x")

    assert isinstance(lease, api.Lease)
    assert lease.token == 1
    row = SyncLock.objects.get(job_name="job")
    assert (row.holder, row.token, row.tick, row.last_status) == ("a:1:x", 1, TICK, "running")
    assert row.locked_until - row.acquired_at == TTL
    assert lease.acquired_at == row.acquired_at


def test_a_second_contender_learns_who_holds_the_lease_until_when():
    first = api.acquire(job="job", tick=TICK, ttl=TTL, holder="a:1:x")
    second = api.acquire(job="job", tick=TICK + timedelta(hours=1), ttl=TTL, holder="b:2:y")

    assert isinstance(second, api.Skip)
    assert second.reason == "held"
    assert second.holder == "a:1:x"
    assert second.locked_until == first.acquired_at + TTL
    assert str(second) == f"held by a:1:x until {second.locked_until.isoformat()}"
    assert SyncLock.objects.get().token == 1


def test_a_claimed_tick_skips_even_after_release():
    first = api.acquire(job="job", tick=TICK, ttl=TTL, holder="a:1:x")
    assert api.release(lease=first, status="succeeded")

    again = api.acquire(job="job", tick=TICK, ttl=TTL, holder="b:2:y")
    earlier = api.acquire(job="job", tick=TICK - timedelta(hours=1), ttl=TTL, holder="b:2:y")

    assert isinstance(again, api.Skip) and again.reason == "tick_claimed"
    # acquire() alone records no JobRun, so the claimant's name is gone with the lease;
    # run_locked() keeps it (see test_processes).
    assert str(again) == f"tick {TICK.isoformat()} already claimed by an earlier run"
    assert isinstance(earlier, api.Skip) and earlier.reason == "tick_claimed"


def test_the_next_tick_acquires_with_the_next_token():
    first = api.acquire(job="job", tick=TICK, ttl=TTL)
    api.release(lease=first, status="succeeded")

    second = api.acquire(job="job", tick=TICK + timedelta(hours=1), ttl=TTL, holder="b:2:y")

    assert isinstance(second, api.Lease)
    assert second.token == 2
    row = SyncLock.objects.get()
    assert (row.holder, row.tick, row.last_status) == ("b:2:y", TICK + timedelta(hours=1), "running")


def test_a_released_lease_keeps_no_holder():
    lease = api.acquire(job="job", tick=TICK, ttl=TTL, holder="a:1:x")
    api.release(lease=lease, status="succeeded")

    row = SyncLock.objects.get()
    assert (row.holder, row.locked_until, row.token, row.last_status) == ("", None, 1, "succeeded")


def test_force_ignores_the_tick_but_never_the_mutex():
    first = api.acquire(job="job", tick=TICK, ttl=TTL, holder="a:1:x")
    forced_while_held = api.acquire(job="job", tick=None, ttl=TTL, holder="b:2:y")
    api.release(lease=first, status="succeeded")
    forced_after = api.acquire(job="job", tick=None, ttl=TTL, holder="b:2:y")

    assert isinstance(forced_while_held, api.Skip) and forced_while_held.reason == "held"
    assert isinstance(forced_after, api.Lease) and forced_after.token == 2
    # A forced run claims no tick: the scheduled slot it ran in stays as it was.
    assert SyncLock.objects.get().tick == TICK


def test_jobs_are_independent():
    assert isinstance(api.acquire(job="one", tick=TICK, ttl=TTL), api.Lease)
    assert isinstance(api.acquire(job="two", tick=TICK, ttl=TTL), api.Lease)
    assert SyncLock.objects.count() == 2


def test_release_and_renew_match_on_the_token():
    stale = api.acquire(job="job", tick=TICK, ttl=TTL, holder="a:1:x")
    api.force_release(job="job", by="test")
    newer = api.acquire(job="job", tick=TICK + timedelta(hours=1), ttl=TTL, holder="b:2:y")
    before = SyncLock.objects.get()

    with pytest.raises(api.LockLost, match=r"lease on job \(token 1\) was taken over or released"):
        api.renew(lease=stale)
    assert api.release(lease=stale, status="failed") is False

    after = SyncLock.objects.get()
    assert (after.holder, after.token, after.locked_until) == ("b:2:y", newer.token, before.locked_until)
    assert after.last_status == "running"
    assert stale.lost


def test_renew_extends_from_the_database_clock():
    lease = api.acquire(job="job", tick=TICK, ttl=TTL)
    before = SyncLock.objects.get()

    api.renew(lease=lease)

    after = SyncLock.objects.get()
    assert after.heartbeat_at >= before.heartbeat_at
    assert after.locked_until - after.heartbeat_at == TTL


def test_renew_after_release_is_refused():
    lease = api.acquire(job="job", tick=TICK, ttl=TTL)
    api.release(lease=lease, status="succeeded")

    with pytest.raises(api.LockLost):
        api.renew(lease=lease)
    assert SyncLock.objects.get().locked_until is None


@pytest.mark.parametrize("ttl", [timedelta(0), timedelta(seconds=-5)])
def test_a_non_positive_ttl_is_refused_at_the_call(ttl):
    with pytest.raises(ValueError, match="ttl must be positive"):
        api.acquire(job="job", tick=TICK, ttl=ttl)
    with pytest.raises(ValueError, match="ttl must be positive"):
        api.run_locked(job="job", tick=TICK, ttl=ttl, fn=lambda lease: None)
    assert not SyncLock.objects.exists()


def test_a_ttl_that_is_not_a_timedelta_is_refused():
    with pytest.raises(TypeError, match="ttl must be a timedelta, got int"):
        api.acquire(job="job", tick=TICK, ttl=300)
