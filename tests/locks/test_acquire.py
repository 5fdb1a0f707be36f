"""Lock semantics 1, 3, 7: one compare-and-set, once per tick, owner-only release."""

import logging
from datetime import timedelta

import pytest

from locks.lease import ClaimRules, Lease, LockLost, Skip, acquire, fenced, release, renew
from locks.models import JobRun, SyncLock, database_now
from locks.operator import force_release, reset_tick
from locks.registry import UnknownJob
from locks.runner import run_locked
from tests.locks.conftest import TICK

TTL = timedelta(minutes=5)
pytestmark = pytest.mark.django_db


def test_first_acquire_creates_the_row_with_token_one():
    lease = acquire(job="job", tick=TICK, ttl=TTL, holder="a:1:x")

    assert isinstance(lease, Lease)
    assert lease.token == 1
    row = SyncLock.objects.get(job_name="job")
    assert (row.holder, row.token, row.tick, row.last_status) == ("a:1:x", 1, TICK, "running")
    assert row.locked_until - row.acquired_at == TTL
    assert lease.grant.acquired_at == row.acquired_at


def test_a_second_contender_learns_who_holds_the_lease_until_when():
    first = acquire(job="job", tick=TICK, ttl=TTL, holder="a:1:x")
    second = acquire(job="job", tick=TICK + timedelta(hours=1), ttl=TTL, holder="b:2:y")

    assert isinstance(second, Skip)
    assert second.reason == "held"
    assert second.holder == "a:1:x"
    assert second.locked_until == first.grant.acquired_at + TTL
    assert str(second) == f"held by a:1:x until {second.locked_until.isoformat()}"
    assert SyncLock.objects.get().token == 1


def test_a_claimed_tick_skips_even_after_release():
    first = acquire(job="job", tick=TICK, ttl=TTL, holder="a:1:x")
    assert release(lease=first, status="succeeded")

    again = acquire(job="job", tick=TICK, ttl=TTL, holder="b:2:y")
    earlier = acquire(job="job", tick=TICK - timedelta(hours=1), ttl=TTL, holder="b:2:y")

    assert isinstance(again, Skip) and again.reason == "tick_claimed"
    # acquire() alone records no JobRun, so the claimant's name is gone with the lease;
    # run_locked() keeps it (see test_processes).
    assert str(again) == f"tick {TICK.isoformat()} already done by an earlier run"
    assert isinstance(earlier, Skip) and earlier.reason == "tick_claimed"
    assert str(earlier) == f"a later tick {TICK.isoformat()} was already claimed by an earlier run"


def test_a_done_tick_names_its_run_even_before_the_run_has_recorded_its_outcome():
    """run_locked releases the lease, then writes the run's outcome: a contender in between
    sees the tick done and the run still ``running``, and is told whose it was all the same."""
    first = acquire(job="job", tick=TICK, ttl=TTL, holder="a:1:x")
    JobRun.objects.create(
        job_name="job", tick=TICK, holder="a:1:x", token=first.token, started_at=first.grant.acquired_at
    )
    assert release(lease=first, status="succeeded")

    again = acquire(job="job", tick=TICK, ttl=TTL, holder="b:2:y")

    assert str(again) == f"tick {TICK.isoformat()} already done by a:1:x"


def test_the_next_tick_acquires_with_the_next_token():
    first = acquire(job="job", tick=TICK, ttl=TTL)
    release(lease=first, status="succeeded")

    second = acquire(job="job", tick=TICK + timedelta(hours=1), ttl=TTL, holder="b:2:y")

    assert isinstance(second, Lease)
    assert second.token == 2
    row = SyncLock.objects.get()
    assert (row.holder, row.tick, row.last_status) == ("b:2:y", TICK + timedelta(hours=1), "running")


def test_a_released_lease_keeps_no_holder():
    lease = acquire(job="job", tick=TICK, ttl=TTL, holder="a:1:x")
    release(lease=lease, status="succeeded")

    row = SyncLock.objects.get()
    assert (row.holder, row.locked_until, row.token, row.last_status) == ("", None, 1, "succeeded")


def test_force_ignores_the_tick_but_never_the_mutex():
    first = acquire(job="job", tick=TICK, ttl=TTL, holder="a:1:x")
    forced_while_held = acquire(job="job", tick=None, ttl=TTL, holder="b:2:y")
    release(lease=first, status="succeeded")
    forced_after = acquire(job="job", tick=None, ttl=TTL, holder="b:2:y")

    assert isinstance(forced_while_held, Skip) and forced_while_held.reason == "held"
    assert isinstance(forced_after, Lease) and forced_after.token == 2
    # A forced run claims no tick: the scheduled slot it ran in stays as it was.
    assert SyncLock.objects.get().tick == TICK


def test_jobs_are_independent():
    assert isinstance(acquire(job="one", tick=TICK, ttl=TTL), Lease)
    assert isinstance(acquire(job="two", tick=TICK, ttl=TTL), Lease)
    assert SyncLock.objects.count() == 2


def test_release_and_renew_match_on_the_token():
    stale = acquire(job="job", tick=TICK, ttl=TTL, holder="a:1:x")
    force_release(job="job", by="test")
    newer = acquire(job="job", tick=TICK + timedelta(hours=1), ttl=TTL, holder="b:2:y")
    before = SyncLock.objects.get()

    with pytest.raises(LockLost, match=r"lease on job \(token 1\) was taken over, released or expired"):
        renew(lease=stale)
    assert release(lease=stale, status="failed") is False

    after = SyncLock.objects.get()
    assert (after.holder, after.token, after.locked_until) == ("b:2:y", newer.token, before.locked_until)
    assert after.last_status == "running"
    assert stale.lost


def test_renew_extends_from_the_database_clock():
    lease = acquire(job="job", tick=TICK, ttl=TTL)
    before = SyncLock.objects.get()

    renew(lease=lease)

    after = SyncLock.objects.get()
    assert after.heartbeat_at >= before.heartbeat_at
    assert after.locked_until - after.heartbeat_at == TTL


def test_renew_after_release_is_refused():
    lease = acquire(job="job", tick=TICK, ttl=TTL)
    release(lease=lease, status="succeeded")

    with pytest.raises(LockLost):
        renew(lease=lease)
    assert SyncLock.objects.get().locked_until is None


@pytest.mark.parametrize("ttl", [timedelta(0), timedelta(seconds=-5)])
def test_a_non_positive_ttl_is_refused_at_the_call(ttl):
    with pytest.raises(ValueError, match="ttl must be positive"):
        acquire(job="job", tick=TICK, ttl=ttl)
    with pytest.raises(ValueError, match="ttl must be positive"):
        run_locked(job="job", tick=TICK, ttl=ttl, fn=lambda lease: None)
    assert not SyncLock.objects.exists()


def test_a_ttl_that_is_not_a_timedelta_is_refused():
    with pytest.raises(TypeError, match="ttl must be a timedelta, got int"):
        acquire(job="job", tick=TICK, ttl=300)


# --- retry of a tick that did not succeed (issue 12, item 4) ---------------------------


@pytest.mark.parametrize("status", ["failed", "lost_lock"])
def test_a_tick_whose_run_did_not_succeed_may_be_claimed_again(status):
    first = acquire(job="job", tick=TICK, ttl=TTL, holder="a:1:x")
    assert release(lease=first, status=status, error="Codeforces was down")

    retry = acquire(job="job", tick=TICK, ttl=TTL, holder="b:2:y")

    assert isinstance(retry, Lease) and retry.token == 2
    row = SyncLock.objects.get()
    assert (row.holder, row.tick, row.tick_done, row.last_status) == ("b:2:y", TICK, False, "running")
    assert release(lease=retry, status="succeeded")
    assert SyncLock.objects.get().tick_done
    done = acquire(job="job", tick=TICK, ttl=TTL, holder="c:3:z")
    assert isinstance(done, Skip) and str(done) == f"tick {TICK.isoformat()} already done by an earlier run"


def test_a_force_released_tick_may_be_claimed_again():
    acquire(job="job", tick=TICK, ttl=TTL, holder="stuck:1:x")
    assert force_release(job="job", by="test").changed

    retry = acquire(job="job", tick=TICK, ttl=TTL, holder="b:2:y")

    assert isinstance(retry, Lease) and retry.token == 3


def test_a_forced_run_leaves_the_tick_and_whether_it_is_done_alone():
    failed = acquire(job="job", tick=TICK, ttl=TTL)
    release(lease=failed, status="failed")
    forced = acquire(job="job", tick=None, ttl=TTL)
    with fenced(forced):
        pass
    release(lease=forced, status="succeeded")

    row = SyncLock.objects.get()
    assert (row.tick, row.tick_done) == (TICK, False)  # the scheduled tick still may be retried
    assert isinstance(acquire(job="job", tick=TICK, ttl=TTL), Lease)


def test_on_sql_databases_a_failed_release_never_reopens_a_done_tick():
    """A done mark on SQLite or PostgreSQL was committed by a fenced write (a rolled-back
    one left none), even when its run saw an error on COMMIT: release leaves it alone.
    (MongoDB, where atomic() is a no-op, takes it back: tests/test_mongodb.py.)"""
    lease = acquire(job="job", tick=TICK, ttl=TTL)
    SyncLock.objects.update(tick_done=True, committed_token=lease.token)  # a commit whose answer was lost
    assert not lease.committed

    assert release(lease=lease, status="failed", error="OperationalError: server closed the connection")

    row = SyncLock.objects.get()
    assert (row.tick_done, row.committed_token, row.last_status) == (True, 1, "failed")
    assert isinstance(acquire(job="job", tick=TICK, ttl=TTL), Skip)


def test_a_fenced_block_marks_the_tick_done_only_if_it_commits():
    lease = acquire(job="job", tick=TICK, ttl=TTL)
    with pytest.raises(ZeroDivisionError), fenced(lease):
        assert lease.writing.is_set()
        SyncLock.objects.update(last_error="written inside")
        raise ZeroDivisionError("the bulk write failed")
    row = SyncLock.objects.get()
    assert (row.tick_done, row.last_error, lease.committed, lease.writing.is_set()) == (
        False,
        "",
        False,
        False,
    )

    with fenced(lease):
        assert lease.writing.is_set()
    assert lease.committed and not lease.writing.is_set()
    assert SyncLock.objects.get().tick_done


# --- the future bound (issue 12, item 2) ---------------------------------------------

HOUR = timedelta(hours=1)


def test_a_tick_more_than_the_horizon_ahead_is_refused_and_nothing_is_stored():
    far = database_now() + 2 * HOUR

    first_use = acquire(job="job", tick=far, ttl=TTL, rules=ClaimRules(horizon=HOUR))

    assert isinstance(first_use, Skip) and first_use.reason == "tick_ahead"
    assert first_use.horizon == HOUR and first_use.db_now is not None
    assert str(first_use) == (
        f"tick {far.isoformat()} is more than 1:00:00 ahead of the database clock ({first_use.db_now.isoformat()})"
    )
    assert not SyncLock.objects.exists()  # not even the job's first row

    release(lease=acquire(job="job", tick=TICK, ttl=TTL), status="succeeded")
    again = acquire(job="job", tick=far, ttl=TTL, rules=ClaimRules(horizon=HOUR))

    assert isinstance(again, Skip) and again.reason == "tick_ahead"
    row = SyncLock.objects.get()
    assert (row.tick, row.token, row.tick_done) == (TICK, 1, True)


def test_a_tick_within_the_horizon_is_claimed():
    near = database_now() + HOUR - timedelta(seconds=30)

    lease = acquire(job="job", tick=near, ttl=TTL, rules=ClaimRules(horizon=HOUR))

    assert isinstance(lease, Lease)
    assert SyncLock.objects.get().tick == near


def test_without_a_horizon_a_far_tick_is_claimed_and_reset_tick_clears_it(caplog):
    """A library caller may omit the bound; what it stores blocks every earlier tick
    until an operator resets it."""
    far = database_now() + timedelta(days=365 * 36)
    release(lease=acquire(job="job", tick=far, ttl=TTL, holder="typo:1:x"), status="succeeded")
    blocked = acquire(job="job", tick=TICK, ttl=TTL)
    assert isinstance(blocked, Skip) and blocked.reason == "tick_claimed"
    assert str(blocked) == f"a later tick {far.isoformat()} was already claimed by an earlier run"

    cleared = reset_tick(job="job", expected_tick=far, by="ops")

    assert (cleared.previous_tick, cleared.was_done, cleared.changed) == (far, True, True)
    row = SyncLock.objects.get()
    assert (row.tick, row.tick_done, row.token) == (None, False, 1)
    [record] = [r for r in caplog.records if r.name == "locks.api"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == f"job=job claimed tick reset by ops; it was {far.isoformat()} (done)"
    assert isinstance(acquire(job="job", tick=TICK, ttl=TTL), Lease)


def test_reset_tick_is_refused_while_the_lease_is_held_so_that_tick_never_runs_twice():
    """A reset under a holder left the row tick=None, tick_done=True once the holder's fenced write
    committed, and the next contender claimed the same tick again (issue 25)."""
    lease = acquire(job="job", tick=TICK, ttl=TTL, holder="a:1:x")

    refused = reset_tick(job="job", expected_tick=TICK, by="ops")

    assert not refused.changed
    assert refused.detail.startswith("the lease on job is held by a:1:x (token 1) until ")
    assert refused.detail.endswith(
        f": a reset now could let its tick {TICK.isoformat()} run twice; nothing reset"
    )
    row = SyncLock.objects.get()
    assert (row.tick, row.holder, row.token) == (TICK, "a:1:x", 1)
    with fenced(lease):
        pass
    assert release(lease=lease, status="succeeded")
    again = acquire(job="job", tick=TICK, ttl=TTL, holder="b:2:y")
    assert isinstance(again, Skip) and again.reason == "tick_claimed"
    done = reset_tick(job="job", expected_tick=TICK, by="ops")  # free now, but done (issue 35): never
    assert (done.changed, done.was_done) == (False, True)
    assert done.detail.endswith("is done: a reset would let that slot run twice; nothing reset")
    with pytest.raises(UnknownJob, match=r"no lock named 'nope' \(known jobs: job\)"):
        reset_tick(job="nope", expected_tick=TICK, by="ops")
