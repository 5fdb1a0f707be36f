"""Lock semantics 2 and 4: expiry is judged by the database clock."""

from datetime import timedelta

import pytest

from locks.lease import Lease, LockLost, Skip, acquire, fenced, release, renew
from locks.models import EXPIRED, FREE, HELD, OVERDUE, SyncLock, now_plus
from tests.locks.conftest import TICK

TTL = timedelta(minutes=5)
pytestmark = pytest.mark.django_db


def _set_expiry(offset: timedelta) -> None:
    """Put locked_until ``offset`` away from the database's now."""
    SyncLock.objects.update(locked_until=now_plus(offset))


def test_a_lease_one_second_past_its_expiry_is_taken():
    acquire(job="job", tick=TICK, ttl=TTL, holder="dead:1:x")
    _set_expiry(timedelta(seconds=-1))

    lease = acquire(job="job", tick=TICK + timedelta(hours=1), ttl=TTL, holder="b:2:y")

    assert isinstance(lease, Lease)
    assert lease.token == 2


def test_a_lease_one_second_before_its_expiry_is_held():
    acquire(job="job", tick=TICK, ttl=TTL, holder="slow:1:x")
    _set_expiry(timedelta(seconds=1))

    skip = acquire(job="job", tick=TICK + timedelta(hours=1), ttl=TTL, holder="b:2:y")

    assert isinstance(skip, Skip) and skip.reason == "held"
    assert skip.holder == "slow:1:x"


def test_an_expired_lease_reopens_its_own_tick_for_a_retry():
    """Its holder died before the tick was done: a later run in the period claims it again."""
    acquire(job="job", tick=TICK, ttl=TTL, holder="dead:1:x")
    _set_expiry(timedelta(seconds=-1))

    retry = acquire(job="job", tick=TICK, ttl=TTL, holder="b:2:y")

    assert isinstance(retry, Lease) and retry.token == 2
    row = SyncLock.objects.get()
    assert (row.holder, row.tick, row.tick_done) == ("b:2:y", TICK, False)


def test_an_expired_lease_whose_write_committed_does_not_reopen_its_tick():
    lease = acquire(job="job", tick=TICK, ttl=TTL, holder="dead:1:x")
    with fenced(lease):
        pass  # its write committed; then it died before releasing
    _set_expiry(timedelta(seconds=-1))

    skip = acquire(job="job", tick=TICK, ttl=TTL, holder="b:2:y")

    assert isinstance(skip, Skip) and skip.reason == "tick_claimed"
    assert str(skip) == f"tick {TICK.isoformat()} already done by dead:1:x"
    assert SyncLock.objects.get().token == 1


def test_an_expired_lease_cannot_be_renewed():
    """ShedLock's contract test shouldNotBeAbleToExtendExpiredLock: expired is lost,
    even when nobody took the lease over."""
    lease = acquire(job="job", tick=TICK, ttl=TTL, holder="slow:1:x")
    _set_expiry(timedelta(seconds=-1))
    before = SyncLock.objects.get()

    with pytest.raises(LockLost, match=r"lease on job \(token 1\) was taken over, released or expired"):
        renew(lease=lease)

    after = SyncLock.objects.get()
    assert (after.locked_until, after.heartbeat_at, after.token) == (
        before.locked_until,
        before.heartbeat_at,
        1,
    )
    assert lease.lost
    with pytest.raises(LockLost), fenced(lease):
        raise AssertionError("unreachable: an expired lease fences its writer out")


@pytest.mark.parametrize(
    ("silent", "left", "state"),
    [
        (None, None, FREE),  # released
        (timedelta(minutes=3, seconds=50), timedelta(minutes=2, seconds=10), HELD),  # 230 s of 360: < 2/3
        (timedelta(minutes=4, seconds=10), timedelta(minutes=1, seconds=50), OVERDUE),  # 250 s of 360: > 2/3
        (timedelta(minutes=9), -timedelta(minutes=3), EXPIRED),
    ],
    ids=["free", "held", "overdue", "expired"],
)
def test_each_state_is_one_filter_on_the_database_clock(silent, left, state):
    lease = acquire(job="job", tick=TICK, ttl=TTL)
    if silent is None:
        release(lease=lease, status="succeeded")
    else:
        SyncLock.objects.update(heartbeat_at=now_plus(-silent))
        _set_expiry(left)

    assert SyncLock.objects.with_state().get().state == state
    assert SyncLock.objects.free().exists() == (state in {FREE, EXPIRED})  # what acquire may take
    assert SyncLock.objects.held().exists() == (state in {HELD, OVERDUE})
    assert SyncLock.objects.expired().exists() == (state == EXPIRED)
    assert SyncLock.objects.overdue().exists() == (state == OVERDUE)
    assert SyncLock.objects.stuck().exists() == (state in {EXPIRED, OVERDUE})
