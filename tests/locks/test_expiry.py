"""Lock semantics 2 and 4: expiry is judged by the database clock."""

from datetime import timedelta

import pytest
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Now

from locks import api
from locks.models import EXPIRED, FREE, HELD, OVERDUE, SyncLock
from tests.locks.conftest import TICK

TTL = timedelta(minutes=5)
pytestmark = pytest.mark.django_db


def _set_expiry(offset: timedelta) -> None:
    """Put locked_until ``offset`` away from the database's now."""
    SyncLock.objects.update(
        locked_until=ExpressionWrapper(Now() + Value(offset), output_field=DateTimeField())
    )


def test_a_lease_one_second_past_its_expiry_is_taken():
    api.acquire(job="job", tick=TICK, ttl=TTL, holder="dead:1:x")
    _set_expiry(timedelta(seconds=-1))

    lease = api.acquire(job="job", tick=TICK + timedelta(hours=1), ttl=TTL, holder="b:2:y")

    assert isinstance(lease, api.Lease)
    assert lease.token == 2


def test_a_lease_one_second_before_its_expiry_is_held():
    api.acquire(job="job", tick=TICK, ttl=TTL, holder="slow:1:x")
    _set_expiry(timedelta(seconds=1))

    skip = api.acquire(job="job", tick=TICK + timedelta(hours=1), ttl=TTL, holder="b:2:y")

    assert isinstance(skip, api.Skip) and skip.reason == "held"
    assert skip.holder == "slow:1:x"


def test_an_expired_lease_does_not_reopen_its_own_tick():
    api.acquire(job="job", tick=TICK, ttl=TTL, holder="dead:1:x")
    _set_expiry(timedelta(seconds=-1))

    skip = api.acquire(job="job", tick=TICK, ttl=TTL, holder="b:2:y")

    assert isinstance(skip, api.Skip) and skip.reason == "tick_claimed"


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
    lease = api.acquire(job="job", tick=TICK, ttl=TTL)
    if silent is None:
        api.release(lease=lease, status="succeeded")
    else:
        SyncLock.objects.update(
            heartbeat_at=ExpressionWrapper(Now() - Value(silent), output_field=DateTimeField())
        )
        _set_expiry(left)

    assert SyncLock.objects.with_state().get().state == state
    assert SyncLock.objects.free().exists() == (state in {FREE, EXPIRED})  # what acquire may take
    assert SyncLock.objects.held().exists() == (state in {HELD, OVERDUE})
    assert SyncLock.objects.expired().exists() == (state == EXPIRED)
    assert SyncLock.objects.overdue().exists() == (state == OVERDUE)
    assert SyncLock.objects.stuck().exists() == (state in {EXPIRED, OVERDUE})
