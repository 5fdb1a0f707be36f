"""Pause and resume (issue 19, item 1): one write on the lock row that acquire's compare-and-set
obeys, so every path stops at once (run_job, --force, the trigger, the scheduler, cron), audited
by a WARNING line (and a LogEntry in the admin: test_run_now.py)."""

from __future__ import annotations

import json
import logging
import secrets
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from locks.lease import Lease, Skip, acquire, release
from locks.models import JobPause, JobRun, Outcome, SyncLock
from locks.operator import pause_job, resume_job
from locks.registry import UnknownJob
from locks.runner import run_job
from tests.conftest import manage, project_env
from tests.jobsapp.models import SlotWrite
from tests.locks.conftest import TICK, schedulers, wait_for

TTL = timedelta(minutes=5)
TOKEN = secrets.token_urlsafe(32)


def locks(*args: str) -> str:
    out = StringIO()
    call_command("locks", *args, stdout=out)
    return out.getvalue()


@pytest.mark.django_db
def test_pause_creates_the_row_of_a_job_that_never_ran_and_every_contender_skips(caplog):
    caplog.set_level(logging.WARNING, logger="locks.api")
    state = pause_job(job="record", by="cli:alice", note="deploy\nin progress")

    assert state.changed and state.paused_by == "cli:alice" and state.paused_note == "deploy in progress"
    lock = SyncLock.objects.get(job_name="record")
    assert (lock.paused_by, lock.paused_note, lock.token) == ("cli:alice", "deploy in progress", 0)
    for tick in (TICK, None):  # a scheduled run and a forced one
        skip = acquire(job="record", tick=tick, ttl=TTL)
        assert isinstance(skip, Skip) and skip.reason == "paused", skip
        assert str(skip) == f"paused by cli:alice since {lock.paused_at.isoformat()}: deploy in progress"
    assert SyncLock.objects.get(job_name="record").token == 0  # nothing was taken
    [pause] = JobPause.objects.all()
    assert (pause.job_name, pause.paused_by, pause.resumed_at) == ("record", "cli:alice", None)
    assert any("job=record paused by cli:alice" in m and "deploy in progress" in m for m in caplog.messages)


@pytest.mark.django_db
def test_a_second_pause_keeps_the_first_and_resume_reopens_every_path(caplog):
    caplog.set_level(logging.WARNING, logger="locks.api")
    first = pause_job(job="record", by="cli:alice", note="first")
    again = pause_job(job="record", by="cli:bob", note="second")
    assert not again.changed and (again.paused_by, again.paused_note) == ("cli:alice", "first")
    assert JobPause.objects.count() == 1

    resumed = resume_job(job="record", by="cli:bob")
    assert resumed.changed and not resumed.paused
    assert not resume_job(job="record", by="cli:bob").changed  # not paused any more: nothing to do
    pause = JobPause.objects.get()
    assert (pause.paused_at, pause.resumed_by) == (first.paused_at, "cli:bob") and pause.resumed_at
    assert any("job=record resumed by cli:bob; it was paused by cli:alice" in m for m in caplog.messages)
    lease = acquire(job="record", tick=None, ttl=TTL)
    assert isinstance(lease, Lease)


@pytest.mark.django_db
def test_a_run_that_holds_the_lease_finishes_and_the_next_one_skips():
    lease = acquire(job="record", tick=TICK, ttl=TTL)
    assert isinstance(lease, Lease)
    pause_job(job="record", by="cli:alice")
    assert release(lease=lease, status=Outcome.SUCCEEDED)  # its owner-only release still matches
    assert SyncLock.objects.get(job_name="record").tick_done
    assert acquire(job="record", tick=TICK + timedelta(minutes=5), ttl=TTL).reason == "paused"


@pytest.mark.django_db
def test_run_job_and_force_both_skip_with_one_line_naming_who_since_when_and_why():
    state = pause_job(job="write_slot", by="admin:alice", note="database maintenance")

    for force in (False, True):
        result = run_job(name="write_slot", force=force, requested_by="cli")
        assert (result.outcome, result.skip.reason) == ("skipped", "paused")
        line = result.describe()
        expected = f"reason=paused by admin:alice since {state.paused_at.isoformat()}: database maintenance"
        assert " outcome=skipped " in line and expected in line, line
    assert not SlotWrite.objects.exists() and not JobRun.objects.exists()


@pytest.mark.django_db
def test_the_command_pauses_resumes_and_refuses_a_name_that_is_not_a_job():
    out = locks("pause", "write_slot", "--note", "upgrading the mail relay")
    assert out.startswith("Paused: write_slot is paused by cli")
    assert out.rstrip().endswith(": upgrading the mail relay.")
    assert locks("pause", "write_slot").startswith("Already paused: write_slot is paused by cli")
    assert locks("resume", "write_slot") == "Resumed write_slot: its next slot runs as usual.\n"
    assert locks("resume", "write_slot") == "write_slot was not paused.\n"

    with pytest.raises(CommandError) as refused:
        locks("pause", "wirte_slot")
    assert refused.value.returncode == 2
    assert str(refused.value).startswith("no job named 'wirte_slot' in LOCKS_JOBS")
    assert not SyncLock.objects.filter(job_name="wirte_slot").exists()  # nothing written
    with pytest.raises(UnknownJob):
        resume_job(job="wirte_slot", by="cli")


@pytest.mark.django_db
def test_status_shows_the_pause_always():
    pause_job(job="record", by="cli:alice", note="why not")
    entries = {entry["job"]: entry for entry in json.loads(locks("status", "--json"))}
    assert entries["record"]["paused"] is True
    assert (entries["record"]["paused_by"], entries["record"]["paused_note"]) == ("cli:alice", "why not")
    assert entries["record"]["paused_at"].startswith("20")
    assert (entries["write_slot"]["paused"], entries["write_slot"]["paused_at"]) == (False, None)
    [row] = [line for line in locks("status").splitlines() if line.startswith("record ")]
    assert row.split("  ")[-1].strip().startswith("by cli:alice since ") and row.endswith(": why not")


def test_the_trigger_answers_409_paused_with_who_and_why(client, settings, transactional_db):
    settings.LOCKS_TRIGGER_TOKEN = TOKEN
    state = pause_job(job="write_slot", by="admin:alice", note="hold on")

    response = client.post("/api/jobs/write_slot/run?force=1", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")

    assert response.status_code == 409
    body = response.json()
    assert (body["outcome"], body["reason"]) == ("skipped", "paused")
    assert (body["paused_by"], body["paused_note"]) == ("admin:alice", "hold on")
    assert body["paused_at"] == state.paused_at.isoformat()
    assert body["skip"]["kind"] == "paused"
    assert not SlotWrite.objects.exists()
    resume_job(job="write_slot", by="admin:alice")
    again = client.post(
        "/api/jobs/write_slot/run?force=1", HTTP_AUTHORIZATION=f"Bearer {TOKEN}", REMOTE_ADDR="192.0.2.9"
    )
    assert again.status_code == 200  # from another client: the rate limit is per client
    assert JobRun.objects.get().requested_by == "trigger"  # who asked, on the run


@pytest.mark.slow
def test_the_command_line_exits_0_with_the_paused_line_and_2_for_an_unknown_job(db_url):
    env = project_env(DATABASE_URL=db_url)
    paused = manage("locks", "pause", "write_slot", "--note", "not now", env=env)
    assert paused.returncode == 0, paused.stderr
    assert " WARNING locks.api job=write_slot paused by cli" in paused.stderr

    forced = manage("run_job", "write_slot", "--force", env=env)
    assert forced.returncode == 0, forced.stderr
    assert " outcome=skipped reason=paused by cli" in forced.stdout and forced.stdout.rstrip().endswith("s")
    assert ": not now duration=" in forced.stdout
    unknown = manage("locks", "pause", "nope", env=env)
    assert unknown.returncode == 2 and "Traceback" not in unknown.stderr
    assert unknown.stderr.startswith("CommandError: no job named 'nope' in LOCKS_JOBS")


def _paused_skips(path) -> int:
    return sum(
        "job=slow_write" in line and "reason=paused by" in line for line in path.read_text().splitlines()
    )


@pytest.mark.slow
def test_a_paused_job_under_three_schedulers_runs_nothing_until_it_is_resumed(db_url, tmp_path):
    """Three run_scheduler replicas on a one-second schedule: while paused, each asks at every slot
    and skips, saying why; nothing runs; once resumed, its next slot runs once."""
    pause_job(job="slow_write", by="cli:alice", note="incident 42")
    env = project_env(DATABASE_URL=db_url, SLOW_WRITE_SCHEDULE="* * * * * *", SLOW_WRITE_SECONDS="0")
    logs = [tmp_path / f"scheduler-{n}.log" for n in range(3)]
    with schedulers(env, logs, "slow_write") as procs:
        wait_for(
            lambda: min(_paused_skips(log) for log in logs) >= 3,  # three slots each, at least
            timeout=60,
            what="three paused skips in every scheduler's log",
        )
        assert not JobRun.objects.filter(job_name="slow_write").exists()
        assert not SlotWrite.objects.exists()

        resume_job(job="slow_write", by="cli:alice")
        wait_for(
            JobRun.objects.filter(job_name="slow_write", status=Outcome.SUCCEEDED).exists,
            timeout=60,
            what="a run once resumed",
        )

    assert [proc.returncode for proc in procs] == [0, 0, 0]
    runs = JobRun.objects.filter(job_name="slow_write")
    assert runs.exists() and all(run.requested_by == "scheduler" for run in runs)
    assert runs.filter(status=Outcome.SUCCEEDED).count() == len(set(runs.values_list("tick", flat=True)))
    assert all(
        run.started_at > JobPause.objects.get().resumed_at - timedelta(seconds=1) for run in runs
    )  # nothing ran while it was paused
    for log in logs:
        assert "Traceback" not in log.read_text()
