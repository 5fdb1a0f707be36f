"""Lock semantics 2 and 4: expiry is judged by the database clock."""

from datetime import timedelta

import pytest
from django.db.models import DateTimeField, ExpressionWrapper, Value
from django.db.models.functions import Now

from locks import api
from locks.models import SyncLock
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
