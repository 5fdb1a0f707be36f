"""The project's two jobs as config/settings.py registers them in LOCKS_JOBS: their
environment variables, their cron lines, their commands, their checks. How any registered
job runs is tests/locks' business, under a host project of its own."""

import runpy
from datetime import timedelta

import pytest
from django.core.management import CommandError, call_command

from config import settings as project  # the module: what the tests' overrides leave alone
from locks.crontab import cronjobs
from locks.models import JobRun, SyncLock
from locks.registry import Job, get_job
from locks.schedule import Schedule
from tests.conftest import ROOT, manage, project_env

SETTINGS = str(ROOT / "config" / "settings.py")
TICK = "2026-11-30T14:00:00+00:00"


def test_the_project_registers_the_sync_and_the_reminders():
    assert list(project.LOCKS_JOBS) == ["sync_contests", "send_reminders"]
    assert project.LOCKS_JOBS["send_reminders"] == {
        "schedule": "* * * * *",
        "callable": "contests.jobs.send_reminders",
        "ttl": 120,
        "max_run_time": 600,
        "retry": {"delays": [20]},
        "expected_errors": ["contests.reminders.ReminderDeliveryError"],
        "dry_run": "contests.jobs.preview_reminders",
        "on_failover": "pause",  # an email sent twice cannot be taken back (issue 26)
    }


def test_the_sync_is_registered_with_its_defaults():
    assert get_job("sync_contests") == Job(
        name="sync_contests",
        cron=Schedule("0 * * * *"),
        callable_path="contests.jobs.sync_contests",
        ttl=timedelta(seconds=600),
        max_run_time=timedelta(seconds=1800),
        retry_delays=(timedelta(minutes=1), timedelta(minutes=5), timedelta(minutes=15)),
        expected_errors=("contests.codeforces.CodeforcesError",),
        dry_run_path="contests.jobs.preview_sync",
    )


@pytest.mark.parametrize("job", ["SYNC_CONTESTS", "SEND_REMINDERS"])
def test_environment_variables_reach_the_registered_job_and_nothing_else(monkeypatch, job):
    for name, value in {
        f"{job}_SCHEDULE": "15 */2 * * *",
        f"{job}_LOCK_TTL": "900",
        f"{job}_MAX_RUN_TIME": "3600",
        "DJANGO_DEBUG": "1",
    }.items():
        monkeypatch.setenv(name, value)
    ns = runpy.run_path(SETTINGS)
    entry = ns["LOCKS_JOBS"][job.lower()]
    assert (entry["schedule"], entry["ttl"], entry["max_run_time"]) == ("15 */2 * * *", 900, 3600)
    # The one cron line asks every job each minute; the schedule is read when it runs.
    assert ns["CRONJOBS"] == [
        (
            "* * * * *",
            "locks.crontab.run_due",
            ["sync_contests", "send_reminders", "check_jobs"],
            {"log_dir": str(ROOT / "var")},
            f">> {ROOT / 'var' / 'cron.log'} 2>&1",
        )
    ]
    # Read where LOCKS_JOBS is built, not kept as settings of their own (two names per knob).
    assert not {f"{job}_SCHEDULE", f"{job}_LOCK_TTL", f"{job}_MAX_RUN_TIME"} & set(ns)


def test_the_settings_build_cronjobs_from_the_registry():
    assert cronjobs(project.LOCKS_JOBS, log_dir=ROOT / "var") == project.CRONJOBS
    assert [line[1:3] for line in project.CRONJOBS] == [
        # check_jobs: the locks app's own (LOCKS_CHECK_JOBS)
        ("locks.crontab.run_due", ["sync_contests", "send_reminders", "check_jobs"]),
    ]


@pytest.mark.parametrize("job", ["sync_contests", "send_reminders"])
def test_the_job_commands_are_run_job_with_the_job_named(transactional_db, job):
    """One command implementation: an alias answers as ``run_job NAME`` does, word for word."""
    for args in (["--tick", "2026-11-30T14:30:30+00:00"], ["--force", "--tick", "2026-11-30T14:00:00+00:00"]):
        with pytest.raises(CommandError) as via_alias:
            call_command(job, *args)
        with pytest.raises(CommandError) as via_run_job:
            call_command("run_job", job, *args)
        assert (str(via_alias.value), via_alias.value.returncode) == (str(via_run_job.value), 2)
    assert str(via_alias.value) == "--force and --tick exclude each other: a forced run claims no tick."
    assert not SyncLock.objects.exists()


@pytest.mark.slow
def test_the_sync_runs_through_run_job(db_url, standin):
    proc = manage(
        "run_job",
        "sync_contests",
        "--tick",
        TICK,
        env=project_env(DATABASE_URL=db_url, CODEFORCES_API_URL=standin.url),
    )

    assert proc.returncode == 0, proc.stderr
    assert f"job=sync_contests tick={TICK} " in proc.stdout
    assert "outcome=succeeded" in proc.stdout and "created=1758" in proc.stdout
    assert standin.calls == 1


@pytest.mark.slow
def test_the_syncs_dry_run_is_its_preview_and_takes_no_lock(db_url, standin):
    proc = manage(
        "run_job",
        "sync_contests",
        "--dry-run",
        env=project_env(DATABASE_URL=db_url, CODEFORCES_API_URL=standin.url),
    )

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        "dry run, nothing written: fetched=1758 created=1758 updated=0 unchanged=0 invalid=0 removed=0 pruned=0"
    )
    assert not SyncLock.objects.exists()
    assert not JobRun.objects.exists()


# --- their checks ------------------------------------------------------------------------


def test_a_non_positive_sync_max_run_time_fails_the_check_of_its_job():
    """SYNC_CONTESTS_MAX_RUN_TIME reaches the sync's LOCKS_JOBS entry, whose check refuses it."""
    proc = manage("check", env=project_env(SYNC_CONTESTS_MAX_RUN_TIME="0"))
    assert proc.returncode == 1
    assert (
        "(locks.E014) LOCKS_JOBS['sync_contests']: max_run_time must be a positive whole number of seconds, got 0."
        in proc.stderr
    )


@pytest.mark.parametrize("job", ["SYNC_CONTESTS", "SEND_REMINDERS"])
def test_a_bad_schedule_or_ttl_is_one_error_on_its_job(job):
    """The environment variables reach the job's LOCKS_JOBS entry; its check names each problem once."""
    proc = manage("check", env=project_env(**{f"{job}_SCHEDULE": "0 25 * * *", f"{job}_LOCK_TTL": "0"}))

    name = job.lower()
    assert proc.returncode == 1
    assert proc.stderr.count("is not a valid cron expression") == 1, proc.stderr
    assert f"(locks.E011) LOCKS_JOBS['{name}']: schedule '0 25 * * *'" in proc.stderr
    assert f"(locks.E013) LOCKS_JOBS['{name}']: ttl" in proc.stderr


def test_run_job_runs_the_reminders_checks_before_a_run(transactional_db):
    """contests' checks are tagged `locks` too, so a cron line's run_job refuses a bad setting."""
    proc = manage("run_job", "send_reminders", "--dry-run", env=project_env(SEND_REMINDERS_MAX_ATTEMPTS="0"))
    assert proc.returncode == 1
    assert "(contests.E006) SEND_REMINDERS_MAX_ATTEMPTS must be 1 or more, got 0." in proc.stderr


@pytest.mark.parametrize("tick", ["0001-01-01T00:00:00", "9999-12-31T23:30:00+00:00"])
def test_a_sync_tick_at_the_ends_of_the_calendar_exits_2_in_one_line(db_url, standin, tick):
    """Issue 21, item 6, through the sync's own command: no OverflowError traceback, no fetch."""
    proc = manage("sync_contests", "--tick", tick, env=project_env(DATABASE_URL=db_url))

    assert proc.returncode == 2, proc.stderr
    [line] = proc.stderr.splitlines()
    assert line.startswith("CommandError: --tick: tick ")
    assert "is out of the range the schedule '0 * * * *' can be computed in" in line
    assert (standin.calls, SyncLock.objects.count(), JobRun.objects.count()) == (0, 0, 0)
