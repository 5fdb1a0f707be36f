"""`manage.py locks status|release` (semantic 9 for the command side)."""

import json
import logging
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from locks.lease import Lease, LockLost, Skip, acquire, release, renew
from locks.models import JobRun, SyncLock
from locks.operator import cli_name, force_release, reset_tick
from locks.runner import run_locked
from tests.conftest import manage, project_env
from tests.locks.conftest import TICK

TTL = timedelta(minutes=5)
pytestmark = pytest.mark.django_db

BY = cli_name()  # who acted from the command line: cli:<OS user>


def _call(*args) -> str:
    out = StringIO()
    call_command("locks", *args, stdout=out)
    return out.getvalue()


def test_status_without_locks_or_jobs_says_so(settings):
    settings.LOCKS_JOBS, settings.LOCKS_CHECK_JOBS = {}, False
    assert _call("status") == "No locks and no jobs in LOCKS_JOBS: a job creates its lock on its first run.\n"


def test_status_lists_registered_jobs_that_never_ran():
    acquire(job="held_job", tick=TICK, ttl=TTL, holder="web-1:42:abc")

    lines = _call("status").splitlines()

    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert list(rows) == [
        "check_jobs",  # the app's own (locks/registry.py)
        "held_job",
        "linger",
        "record",
        "refuse",
        "slow_write",
        "write_slot",
    ]  # by name, locks and jobs alike
    assert rows["record"] == ["record", "never", "run", "-", "-", "-", "-", "-", "-", "-"]
    assert rows["write_slot"][1:3] == ["never", "run"]
    assert rows["held_job"][1] == "held"


def test_status_json_lists_registered_jobs_that_never_ran():
    acquire(job="record", tick=TICK, ttl=TTL, holder="web-1:42:abc")

    entries = {entry["job"]: entry for entry in json.loads(_call("status", "--json"))}

    assert entries["record"]["state"] == "held"
    assert entries["write_slot"] == {
        "job": "write_slot",
        "state": "never run",
        "holder": "",
        "token": None,
        "locked_until": None,
        "heartbeat_at": None,
        "tick": None,
        "last_status": "",
        "last_started_at": None,
        "last_finished_at": None,
        "last_error": "",
        "db_now": None,
        "paused": False,
        "paused_at": None,
        "paused_by": "",
        "paused_note": "",
        "timezone": "UTC",
        "tick_local": None,
    }
    assert set(entries["write_slot"]) == set(entries["record"])  # one shape for both
    assert (entries["record"]["tick"], entries["record"]["tick_local"]) == (
        TICK.isoformat(),
        TICK.isoformat(),
    )


def test_status_lists_each_lock_with_its_state():
    acquire(job="held_job", tick=TICK, ttl=TTL, holder="web-1:42:abc")
    done = acquire(job="free_job", tick=TICK, ttl=TTL, holder="web-2:7:def")
    release(lease=done, status="succeeded")
    acquire(job="stuck_job", tick=TICK, ttl=TTL, holder="web-3:9:ghi")
    SyncLock.objects.filter(job_name="stuck_job").update(
        locked_until=SyncLock.objects.get(job_name="stuck_job").acquired_at - TTL
    )

    lines = _call("status").splitlines()

    assert lines[0].split() == [
        "JOB",
        "STATE",
        "HOLDER",
        "TOKEN",
        "LOCKED",
        "UNTIL",
        "TICK",
        "LAST",
        "RUN",
        "FINISHED",
        "PAUSED",
    ]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["held_job"][1:4] == ["held", "web-1:42:abc", "1"]
    assert rows["held_job"][-3:] == ["running", "-", "-"]
    assert rows["free_job"][1:5] == ["free", "-", "1", "-"]
    assert rows["free_job"][-4] == "succeeded"
    assert rows["stuck_job"][1] == "expired"


def test_status_json(settings):
    settings.LOCKS_JOBS, settings.LOCKS_CHECK_JOBS = {}, False
    acquire(job="held_job", tick=TICK, ttl=TTL, holder="web-1:42:abc")

    [entry] = json.loads(_call("status", "--json"))

    assert entry["job"] == "held_job"
    assert entry["state"] == "held"
    assert entry["holder"] == "web-1:42:abc"
    assert entry["token"] == 1
    assert entry["tick"] == TICK.isoformat()
    assert entry["last_status"] == "running"
    assert entry["locked_until"] > entry["db_now"]


def test_release_frees_the_lock_bumps_the_token_and_logs(caplog):
    lease = acquire(job="write_slot", tick=TICK, ttl=TTL, holder="web-1:42:abc")

    out = _call("release", "write_slot")

    assert out == "Released write_slot: holder was web-1:42:abc (token 1); new token 2.\n"
    lock = SyncLock.objects.get()
    assert (lock.holder, lock.locked_until, lock.token, lock.last_status) == ("", None, 2, "released")
    assert f"force-released by {BY}" in lock.last_error
    [record] = [r for r in caplog.records if r.name == "locks.api"]
    assert record.levelno == logging.WARNING
    assert record.getMessage() == (
        f"job=write_slot force-released by {BY}; previous holder web-1:42:abc (token 1), new token 2"
    )
    # The old holder can no longer renew or release.
    with pytest.raises(LockLost):
        renew(lease=lease)
    assert release(lease=lease, status="succeeded") is False


def test_release_of_a_free_lock_changes_nothing():
    lease = acquire(job="write_slot", tick=TICK, ttl=TTL)
    release(lease=lease, status="succeeded")

    assert _call("release", "write_slot") == "write_slot was not held; nothing to release.\n"
    assert SyncLock.objects.get().token == 1


def test_release_of_an_unknown_job_is_a_clear_error():
    acquire(job="write_slot", tick=TICK, ttl=TTL)

    with pytest.raises(CommandError, match=r"no lock named 'nope' \(known jobs: write_slot\)"):
        _call("release", "nope")


def test_release_of_an_unknown_job_exits_1(db_url):
    proc = manage("locks", "release", "nope", env=project_env(DATABASE_URL=db_url))

    assert proc.returncode == 1
    assert proc.stderr.strip() == "CommandError: no lock named 'nope' (known jobs: none yet)"


def test_release_closes_the_released_holders_run(transactional_db):
    # A holder that died mid-run leaves its JobRun "running"; the release closes it.
    def die_holding(lease):
        force_release(job="write_slot", by="ops")
        return {}

    from locks.models import JobRun

    run_locked(job="write_slot", tick=TICK, ttl=TTL, fn=die_holding)
    run = JobRun.objects.get()
    # It finished, but its lease had changed hands: recorded as such, not as a success.
    assert (run.status, run.error) == (
        "lost_lock",
        "lease on write_slot (token 1) was taken over before the run finished",
    )

    lease = acquire(job="write_slot", tick=None, ttl=TTL)
    JobRun.objects.create(
        job_name="write_slot",
        tick=None,
        holder=lease.holder,
        token=lease.token,
        started_at=lease.grant.acquired_at,
    )
    _call("release", "write_slot")

    closed = JobRun.objects.get(token=lease.token)
    assert (closed.status, closed.error) == ("lost_lock", f"force-released by {BY}")
    assert closed.finished_at is not None


# --- release by token, reset of the claimed tick (issue 12, items 2 and 3) -----------


def test_release_with_the_shown_token_releases_that_lease():
    lease = acquire(job="write_slot", tick=TICK, ttl=TTL, holder="web-1:42:abc")

    out = _call("release", "write_slot", "--token", str(lease.token))

    assert out == "Released write_slot: holder was web-1:42:abc (token 1); new token 2.\n"
    assert SyncLock.objects.get().last_status == "released"


def test_release_with_a_token_another_holder_replaced_changes_nothing():
    old = acquire(job="write_slot", tick=TICK, ttl=TTL, holder="web-1:42:abc")
    release(lease=old, status="failed")
    acquire(job="write_slot", tick=TICK, ttl=TTL, holder="web-2:7:def")  # the retry, healthy
    before = SyncLock.objects.values().get()

    with pytest.raises(CommandError) as refused:
        _call("release", "write_slot", "--token", str(old.token), "--reset-tick", TICK.isoformat())

    assert str(refused.value) == "lease on write_slot is now token 2 held by web-2:7:def; nothing released"
    assert SyncLock.objects.values().get() == before  # neither released nor its tick reset


def test_release_with_the_token_of_a_lease_that_finished_leaves_its_outcome():
    lease = acquire(job="write_slot", tick=TICK, ttl=TTL, holder="web-1:42:abc")
    release(lease=lease, status="succeeded")

    out = _call("release", "write_slot", "--token", str(lease.token))

    assert out == (
        "lease on write_slot (token 1) is not held any more (finished as succeeded); nothing released.\n"
    )
    lock = SyncLock.objects.get()
    assert (lock.token, lock.last_status, lock.last_error) == (1, "succeeded", "")


def test_release_of_an_expired_lease_releases_nothing():
    acquire(job="write_slot", tick=TICK, ttl=TTL, holder="dead:1:x")
    SyncLock.objects.update(locked_until=SyncLock.objects.get().acquired_at - TTL)

    out = _call("release", "write_slot")

    assert out.startswith("lease on write_slot (token 1) is not held any more (its lease expired at ")
    assert out.endswith(" without being released; the next run takes it over); nothing released.\n")
    lock = SyncLock.objects.get()
    assert (lock.token, lock.last_status) == (1, "running")


def test_release_reset_tick_releases_and_clears_a_far_future_tick(caplog):
    """A mistyped tick stored by a caller without the bound blocks every real tick."""
    far = TICK.replace(year=2062)
    acquire(job="write_slot", tick=far, ttl=TTL, holder="web-1:42:abc")
    assert isinstance(acquire(job="write_slot", tick=TICK, ttl=TTL), Skip)

    out = _call("release", "write_slot", "--reset-tick", far.isoformat())

    assert out == (
        "Released write_slot: holder was web-1:42:abc (token 1); new token 2.\n"
        f"Reset the claimed tick of write_slot: it was {far.isoformat()} (not done).\n"
    )
    lock = SyncLock.objects.get()
    assert (lock.tick, lock.tick_done, lock.locked_until) == (None, False, None)
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings[-1] == (f"job=write_slot claimed tick reset by {BY}; it was {far.isoformat()} (not done)")
    release(lease=acquire(job="write_slot", tick=TICK, ttl=TTL), status="failed")
    reset_tick(job="write_slot", expected_tick=TICK, by="test")  # the lease free: a reset may
    assert isinstance(acquire(job="write_slot", tick=None, ttl=TTL), Lease)
    assert _call("release", "write_slot", "--reset-tick", TICK.isoformat()).endswith(
        "new token 5.\nwrite_slot has no claimed tick; nothing to reset.\n"
    )


def test_release_reset_tick_of_a_tick_claimed_since_resets_nothing():
    """Issue 17, reproduction 9: the reset names the tick `locks status` showed, and acts only
    while it is still the claimed one."""
    shown, newer = TICK, TICK + timedelta(minutes=5)
    release(lease=acquire(job="write_slot", tick=newer, ttl=TTL), status="succeeded")
    before = SyncLock.objects.values().get()

    with pytest.raises(CommandError) as refused:
        _call("release", "write_slot", "--reset-tick", shown.isoformat())

    assert str(refused.value) == (
        f"the claimed tick of write_slot is now {newer.isoformat()} (done), not the {shown.isoformat()} shown; "
        "nothing reset."
    )
    assert SyncLock.objects.values().get() == before


def test_release_reset_tick_needs_the_tick_it_resets_exit_2(db_url):
    env = project_env(DATABASE_URL=db_url)
    bare = manage("locks", "release", "write_slot", "--reset-tick", env=env)
    bad = manage("locks", "release", "write_slot", "--reset-tick", "yesterday", env=env)

    assert (bare.returncode, bad.returncode) == (2, 2)
    assert "argument --reset-tick: expected one argument" in bare.stderr
    assert "argument --reset-tick: 'yesterday' is not an ISO 8601 date-time" in bad.stderr
    assert "Traceback" not in bare.stderr + bad.stderr


def test_release_token_must_be_a_number_exit_2(db_url):
    proc = manage("locks", "release", "write_slot", "--token", "abc", env=project_env(DATABASE_URL=db_url))

    assert proc.returncode == 2
    assert "argument --token: invalid int value: 'abc'" in proc.stderr


def test_release_with_a_token_whose_successor_already_finished_says_so():
    old = acquire(job="write_slot", tick=TICK, ttl=TTL, holder="web-1:42:abc")
    release(lease=old, status="failed")
    retry = acquire(job="write_slot", tick=TICK, ttl=TTL, holder="web-2:7:def")
    release(lease=retry, status="succeeded")

    with pytest.raises(CommandError) as refused:
        _call("release", "write_slot", "--token", str(old.token))

    assert str(refused.value) == (
        "lease on write_slot is now token 2, not held (finished as succeeded); nothing released"
    )
    assert SyncLock.objects.get().last_status == "succeeded"


def test_release_reset_tick_of_a_done_tick_at_or_before_now_is_refused_with_or_without_a_token(db_url):
    """Issue 35, items 14 and 12: run_job, then a reset of its done tick, then run_job: that slot
    ran twice. A reset is for a future tick that blocks the real ones."""
    env = project_env(DATABASE_URL=db_url)
    first = manage("run_job", "write_slot", "--tick", TICK.isoformat(), env=env)
    assert first.returncode == 0, first.stderr
    before = SyncLock.objects.values().get()
    assert (before["tick"], before["tick_done"]) == (TICK, True)
    refusal = (
        f"the claimed tick {TICK.isoformat()} of write_slot is done: a reset would let that slot run twice; "
        "nothing reset."
    )
    for token in ([], ["--token", str(before["token"])]):
        refused = manage("locks", "release", "write_slot", *token, "--reset-tick", TICK.isoformat(), env=env)
        assert (refused.returncode, refused.stderr.strip()) == (1, f"CommandError: {refusal}"), token
        assert SyncLock.objects.values().get() == before
    again = manage("run_job", "write_slot", "--tick", TICK.isoformat(), env=env)
    assert again.returncode == 0 and "outcome=skipped reason=tick" in again.stderr, again.stderr
    assert JobRun.objects.filter(tick=TICK, status="succeeded").count() == 1
