"""A rolling deploy (issue 35, item 18; issue 36, item 7): the previous releases' `run_job` and
`run_scheduler`, still running on some copies, against a database this release has migrated. Their
inserts name only the columns they know: every NOT NULL column added since needs a database
default, or their runs fail to record. The tick rows' migration backfills and reverses."""

import shutil
import signal
import subprocess
import sys
import time
from collections import Counter
from datetime import UTC, datetime, timedelta

import pytest
from django.core.management import call_command

from locks.models import JobRun, SyncLock, Tick
from tests.conftest import ROOT, project_env, spawn
from tests.jobsapp.models import SlotWrite

# The releases this one upgrades from: the last commit before locks 0007 (docs/deployment.md,
# "To this release, and back"), and the last before the tick rows (locks 0014).
PREVIOUS, BEFORE_TICKS = "491f779", "40a28d5"
TICK = "2026-11-30T14:00:00+00:00"
pytestmark = pytest.mark.slow


def release_code(commit: str, root):
    """``commit``'s code in ``root`` (``git archive``: no worktree to remove)."""
    if shutil.which("git") is None or subprocess.run(["git", "cat-file", "-e", commit], cwd=ROOT).returncode:
        pytest.skip(f"the previous release's commit {commit} is not in this checkout")
    # From the repository's top: the host suite on the wheel runs from a copy of tests/ inside var/,
    # where `git archive` would take only that subdirectory's files.
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=ROOT, capture_output=True, text=True)
    archive = subprocess.run(
        ["git", "archive", commit], cwd=top.stdout.strip(), capture_output=True, check=True
    )
    root.mkdir()
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    return root


@pytest.fixture
def previous_release(tmp_path):
    yield release_code(PREVIOUS, tmp_path / "previous")
    shutil.rmtree(tmp_path / "previous")


@pytest.fixture
def release_before_ticks(tmp_path):
    yield release_code(BEFORE_TICKS, tmp_path / "before_ticks")
    shutil.rmtree(tmp_path / "before_ticks")


def test_the_previous_releases_run_job_records_its_run_on_this_releases_schema(previous_release, db_url):
    """Was, on PostgreSQL and SQLite alike: its first lock row's INSERT left `run_requested_by` and
    `failover_note` NULL ("the lock row keeps disappearing", exit 1), and with a row there its
    `JobRun` left `failover` NULL: the job ran, its run was not recorded."""
    proc = subprocess.run(
        [sys.executable, "manage.py", "run_job", "write_slot", "--tick", TICK],
        cwd=previous_release,
        env=project_env(DATABASE_URL=db_url),
        capture_output=True,
        text=True,
        timeout=120,
    )

    assert proc.returncode == 0, proc.stderr
    assert "null value" not in proc.stderr
    run = JobRun.objects.get()
    assert (run.job_name, run.status, run.tick.isoformat(), run.failover) == (
        "write_slot",
        "succeeded",
        TICK,
        "",
    )
    assert SlotWrite.objects.get().token == run.token
    lock = SyncLock.objects.get(job_name="write_slot")
    assert (lock.tick_done, lock.run_requested_by, lock.failover_note) == (True, "", "")


SECONDS = "* * * * * */3"  # croniter's sixth field: a slot every 3 seconds


def test_a_scheduler_of_the_release_before_ticks_beside_one_of_this_release_runs_each_slot_once(
    release_before_ticks, db_url
):
    """The copy that does not know tick rows asks for every slot; this release's claims first. The
    lease row, which both write, lets one of them run each slot, and both record their runs."""
    env = project_env(DATABASE_URL=db_url, SLOW_WRITE_SCHEDULE=SECONDS, SLOW_WRITE_SECONDS="0")
    command = ["manage.py", "run_scheduler", "slow_write"]
    old = subprocess.Popen(
        [sys.executable, *command], cwd=release_before_ticks, env=env, stderr=subprocess.PIPE, text=True
    )
    new = spawn([str(ROOT / command[0]), *command[1:]], env=env)
    time.sleep(14)
    for proc in (old, new):
        proc.send_signal(signal.SIGTERM)
    errs = [proc.communicate(timeout=60)[1] for proc in (old, new)]  # each within its grace

    assert [old.returncode, new.returncode] == [0, 0], errs
    runs = JobRun.objects.filter(job_name="slow_write", status="succeeded")
    per_slot = Counter(runs.values_list("tick", flat=True))
    assert len(per_slot) >= 3 and set(per_slot.values()) == {1}, per_slot
    assert Tick.objects.filter(job_name="slow_write").exists()  # the new copy claimed its slots


def test_the_tick_rows_migration_backfills_from_the_runs_and_reverses(transactional_db):
    """Migrated back to locks 0013 the tick rows go and nothing else changes; forward, each tick of
    the run history gets its row: closed when a run succeeded, open (asked for again) otherwise."""
    call_command("migrate", "locks", "0013", verbosity=0)
    try:
        first, second = (datetime(2026, 11, 30, hour, tzinfo=UTC) for hour in (14, 15))
        started = datetime(2026, 11, 30, 16, tzinfo=UTC)
        for tick, status, minutes in ((first, "failed", 0), (first, "succeeded", 1), (second, "failed", 2)):
            JobRun.objects.create(
                job_name="sync", tick=tick, holder=f"h:{minutes}:x", token=minutes + 1, status=status,
                started_at=started + timedelta(minutes=minutes),
            )  # fmt: skip
        JobRun.objects.create(
            job_name="sync", holder="h:9:x", token=9, status="succeeded", started_at=started
        )
    finally:
        call_command("migrate", "locks", verbosity=0)

    rows = {row.tick: row for row in Tick.objects.filter(job_name="sync")}
    assert set(rows) == {first, second}  # a forced run has no tick
    assert (rows[first].status, rows[first].until, rows[first].claims, rows[first].holder) == (
        "succeeded",
        None,
        2,
        "h:1:x",
    )
    assert (rows[second].status, rows[second].claims) == ("failed", 1) and rows[second].until is not None
    assert JobRun.objects.count() == 4
