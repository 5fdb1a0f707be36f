"""A rolling deploy (issue 35, item 18): the previous release's `run_job`, still running on some
copies, against a database this release has migrated. Its inserts name only the columns it knows:
every NOT NULL column added since needs a database default, or its runs fail to record."""

import shutil
import subprocess
import sys

import pytest

from locks.models import JobRun, SyncLock
from tests.conftest import ROOT, project_env
from tests.jobsapp.models import SlotWrite

# The release this one upgrades from: the last commit before locks 0007 (docs/deployment.md,
# "To this release, and back").
PREVIOUS = "491f779"
TICK = "2026-11-30T14:00:00+00:00"
pytestmark = pytest.mark.slow


@pytest.fixture
def previous_release(tmp_path):
    """The previous release's code in a temporary directory (``git archive``: no worktree to remove)."""
    if (
        shutil.which("git") is None
        or subprocess.run(["git", "cat-file", "-e", PREVIOUS], cwd=ROOT).returncode
    ):
        pytest.skip(f"the previous release's commit {PREVIOUS} is not in this checkout")
    # From the repository's top: the host suite on the wheel runs from a copy of tests/ inside var/,
    # where `git archive` would take only that subdirectory's files.
    top = subprocess.run(["git", "rev-parse", "--show-toplevel"], cwd=ROOT, capture_output=True, text=True)
    archive = subprocess.run(
        ["git", "archive", PREVIOUS], cwd=top.stdout.strip(), capture_output=True, check=True
    )
    root = tmp_path / "previous"
    root.mkdir()
    subprocess.run(["tar", "-x", "-C", str(root)], input=archive.stdout, check=True)
    yield root
    shutil.rmtree(root)


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
