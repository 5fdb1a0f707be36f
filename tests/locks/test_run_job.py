"""`manage.py run_job NAME` as real processes: the host project's jobs, the exit codes."""

import signal
import subprocess
import sys
import time
from datetime import timedelta

import pytest
from django.db import connection

from locks.models import JobRun, SyncLock, database_now
from tests.conftest import ROOT, manage, project_env, spawn
from tests.jobsapp.models import SlotWrite
from tests.locks.conftest import faketime_or_skip

TICK = "2026-11-30T14:00:00+00:00"
REGISTERED = "write_slot, record, refuse, linger, slow_write, check_jobs"
pytestmark = pytest.mark.slow


@pytest.fixture
def env(db_url):
    """The host project (tests/hostproject/settings.py) on the test database."""
    return project_env(DATABASE_URL=db_url)


def test_a_registered_job_runs_once_per_tick(env):
    procs = [spawn(["manage.py", "run_job", "record", "--tick", TICK], env=env) for _ in range(4)]
    outputs = [proc.communicate(timeout=120) for proc in procs]

    assert [proc.returncode for proc in procs] == [0] * 4, outputs
    outcomes = sorted(out.split(" outcome=")[1].split()[0] for out, _err in outputs)
    assert outcomes == ["skipped"] * 3 + ["succeeded"]
    [succeeded] = [out for out, _err in outputs if "outcome=succeeded" in out]
    assert succeeded.startswith(f"job=record tick={TICK} holder=")
    assert " recorded=1 ttl=60 " in succeeded
    run = JobRun.objects.get()
    assert (run.job_name, run.status, run.stats, run.tick.isoformat()) == (
        "record",
        "succeeded",
        {"recorded": 1, "ttl": 60},
        TICK,
    )


def test_a_job_that_writes_runs_through_run_job_under_its_token(env):
    proc = manage("run_job", "write_slot", "--tick", TICK, env=env)

    assert proc.returncode == 0, proc.stderr
    assert f"job=write_slot tick={TICK} " in proc.stdout
    assert "outcome=succeeded" in proc.stdout and " written=1 " in proc.stdout
    row = SlotWrite.objects.get()
    assert (row.job, row.tick.isoformat(), row.token) == ("write_slot", TICK, JobRun.objects.get().token)


def test_a_failed_run_exits_1_with_one_error_line_and_no_traceback(env):
    proc = manage("run_job", "refuse", "--force", env=env)

    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    [error] = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert " ERROR locks.api job=refuse tick=forced holder=" in error
    assert "outcome=failed" in error and "error=nothing to record today" in error
    assert SyncLock.objects.get(job_name="refuse").locked_until is None  # released


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["nope"], f"CommandError: no job named 'nope' in LOCKS_JOBS (registered: {REGISTERED})"),
        (["record", "--force", "--tick", TICK], "CommandError: --force and --tick exclude each other"),
        (["record", "--tick", "noon"], "argument --tick: 'noon' is not an ISO 8601 date-time"),
        (
            ["record", "--requested-by", "admin: x"],
            "argument --requested-by: 'admin: x' is none of cli, cron, scheduler, trigger or admin:<user>",
        ),
        ([], "the following arguments are required: job"),
        (
            ["record", "--tick", "2026-11-30T14:02:00+00:00"],
            "CommandError: --tick: tick 2026-11-30T14:02:00+00:00 is not a slot of the schedule '*/5 * * * *' "
            "(UTC); the nearest valid slots are 2026-11-30T14:00:00+00:00 and 2026-11-30T14:05:00+00:00",
        ),
        (
            ["record", "--tick", "2062-12-01T08:00:00+00:00"],
            "CommandError: --tick: tick 2062-12-01T08:00:00+00:00 is more than the tick window (0:01:15) "
            "ahead of the database clock (",
        ),
        (
            ["record", "--dry-run", "--tick", "2026-11-30T14:02:00+00:00"],
            "CommandError: --tick: tick 2026-11-30T14:02:00+00:00 is not a slot",
        ),
        (
            ["linger", "--dry-run"],
            "CommandError: --dry-run: job 'linger' has no dry run (no 'dry_run' in its LOCKS_JOBS entry)",
        ),
    ],
)
def test_bad_arguments_exit_2_clearly_and_change_nothing(env, args, message):
    proc = manage("run_job", *args, env=env)

    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert not SlotWrite.objects.exists()
    assert not SyncLock.objects.exists()
    assert not JobRun.objects.exists()


def test_a_tick_38_minutes_early_exits_2_and_the_current_slot_still_runs(env):
    """Issue 17, reproduction 9: `run_job --tick <next slot>` 38 minutes early ran it (it was
    within one period of a daily schedule), and the current slot was then refused for good as
    "a later tick was claimed". Beyond the tick window, only the slot a run claims now may be
    named: exit 2, nothing stored."""
    soon = (database_now() + timedelta(minutes=38)).replace(second=0, microsecond=0)
    env = {**env, "SLOW_WRITE_SCHEDULE": f"{soon.minute} {soon.hour} * * *", "SLOW_WRITE_SECONDS": "0"}

    early = manage("run_job", "slow_write", "--tick", soon.isoformat(), env=env)

    assert early.returncode == 2, early.stdout + early.stderr
    assert f"CommandError: --tick: tick {soon.isoformat()} is more than the tick window (0:05:00) ahead" in (
        early.stderr
    )
    assert not SyncLock.objects.exists() and not SlotWrite.objects.exists()
    now = manage("run_job", "slow_write", env=env)
    assert now.returncode == 0, now.stderr
    yesterday = (soon - timedelta(days=1)).isoformat()
    assert f"job=slow_write tick={yesterday} " in now.stdout and "outcome=succeeded" in now.stdout
    assert [row.tick.isoformat() for row in SlotWrite.objects.all()] == [yesterday]


OUT_OF_RANGE = "is out of the range the schedule '{}' can be computed in"


@pytest.mark.parametrize(
    ("command", "tick"),
    [
        (["run_job", "record"], "0001-01-01T00:00:00"),
        (["run_job", "record"], "0001-01-01T04:00:00+05:00"),  # year 0 in UTC
        (["run_job", "record"], "9999-12-31T23:59:00"),
        (["run_job", "record", "--dry-run"], "9999-12-31T23:59:59"),
    ],
)
def test_a_tick_at_the_ends_of_the_calendar_exits_2_in_one_line(env, command, tick):
    """Issue 21, item 6: these ended in an OverflowError traceback, exit 1."""
    proc = manage(*command, "--tick", tick, env=env)

    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("CommandError: --tick: tick ") and OUT_OF_RANGE.format("*/5 * * * *") in line
    assert (SyncLock.objects.count(), JobRun.objects.count()) == (0, 0)


def test_dry_run_shows_the_preview_and_takes_no_lock(env):
    record = manage("run_job", "record", "--dry-run", env=env)

    assert record.returncode == 0, record.stderr
    assert record.stdout.strip() == "dry run, nothing written: would_record=1"
    assert not SyncLock.objects.exists()
    assert not JobRun.objects.exists()


STOPS = [signal.SIGTERM, signal.SIGINT]  # SIGINT: Ctrl-C in the terminal running run_job (issue 35)


@pytest.mark.parametrize("stop", STOPS, ids=lambda stop: stop.name)
def test_sigterm_mid_run_records_the_run_and_releases_the_lease(env, stop):
    proc = spawn(["manage.py", "run_job", "linger", "--tick", TICK], env=env)
    deadline = time.monotonic() + 60
    while not JobRun.objects.filter(job_name="linger").exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(stop)
    _out, err = proc.communicate(timeout=60)

    assert proc.returncode == 128 + stop, err
    assert "Traceback" not in err
    # Before its body began (the JobRun is written first), or in it: either way recorded and released.
    assert "outcome=failed" in err and "error=interrupted" in err and f"SystemExit: {128 + stop}" in err
    lock = SyncLock.objects.get(job_name="linger")
    assert (lock.locked_until, lock.last_status) == (None, "failed")
    assert JobRun.objects.get().status == "failed"


@pytest.mark.parametrize("stop", STOPS, ids=lambda stop: stop.name)
def test_sigterm_between_the_lease_and_the_body_still_records_the_run_and_releases_the_lease(env, stop):
    """The stop arrives as the run records its start (a receiver of JobRun's post_save sends it):
    held back until the body begins, so the run is recorded and its lease released, not left
    held until it expires with the run ``running`` and no log line. Its body never started, so it
    used no attempt (issue 35: it used one, and the next run of the slot waited for its retry
    delay; a job without retries lost the slot)."""
    proc = manage("run_job", "record", "--tick", TICK, env={**env, "JOBSAPP_SIGNAL_AT_RUN_START": stop.name})

    assert proc.returncode == 128 + stop, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "outcome=failed" in proc.stderr
    assert (
        f"error=interrupted before its body started (SystemExit: {128 + stop}): its attempt is not used"
        in proc.stderr
    )
    assert " recorded=1 " not in proc.stderr + proc.stdout  # the body never ran
    lock = SyncLock.objects.get(job_name="record")
    assert (lock.locked_until, lock.last_status, lock.tick_attempts, lock.retry_at) == (
        None,
        "failed",
        0,
        None,
    )
    assert JobRun.objects.get().status == "failed"
    again = manage("run_job", "record", "--tick", TICK, env=env)
    assert again.returncode == 0 and " outcome=succeeded " in again.stderr and " attempt=1/3 " in again.stderr


def test_each_run_records_who_asked_for_it(env):
    assert manage("run_job", "record", "--force", env=env).returncode == 0
    assert manage("run_job", "record", "--force", "--requested-by", "admin:alice", env=env).returncode == 0
    assert list(JobRun.objects.order_by("started_at").values_list("requested_by", flat=True)) == [
        "cli",
        "admin:alice",
    ]


def test_a_copy_five_minutes_fast_leaves_a_burst_to_the_others(db_url):
    """Issue 35, item 13, as real processes: six minutely slots an hour from the database's minute
    (as `54-59 0 * * *` a day). Was: `faketime -f +5m run_job` claimed the burst's last slot five
    minutes early and the on-time copy's ask skipped ("a later tick ... was already claimed").
    PostgreSQL only: SQLite's clock is the process's own, and faketime fakes it too."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only: SQLite's clock is the process's own, and faketime fakes it too")
    first = database_now().replace(second=0, microsecond=0)
    burst = ",".join(str((first.minute + minute) % 60) for minute in range(6))
    env = project_env(DATABASE_URL=db_url, WRITE_SLOT_SCHEDULE=f"{burst} * * * *")
    fast = subprocess.run(
        [faketime_or_skip(), "-f", "+5m", sys.executable, str(ROOT / "manage.py"), "run_job", "write_slot"],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    on_time = manage("run_job", "write_slot", env=env)

    assert fast.returncode == 0, fast.stderr
    assert (
        f"outcome=skipped reason=tick {(first + timedelta(minutes=5)).isoformat()} is more than"
        in fast.stderr
    )
    assert on_time.returncode == 0 and "outcome=succeeded" in on_time.stdout, on_time.stderr
    run = JobRun.objects.get()
    assert run.tick in {first, first + timedelta(minutes=1)}
    assert list(SlotWrite.objects.values_list("tick", flat=True)) == [run.tick]
