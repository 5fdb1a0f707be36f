"""LOCKS_JOBS read into the registry: jobs, their defaults and errors, running one, CRONJOBS."""

import json
import logging
import subprocess
import sys
from datetime import datetime, timedelta

import pytest
from django.core.exceptions import ImproperlyConfigured
from django.utils import timezone

from locks import schedule
from locks.crontab import cronjobs
from locks.models import JobRun, SyncLock, database_now
from locks.registry import NoDryRun, UnknownJob, _registry, get_job, jobs
from locks.runner import run_job
from locks.schedule import InvalidTick, Schedule
from tests.conftest import ROOT, project_env
from tests.hostproject import settings as host  # the module: what the tests' overrides leave alone
from tests.jobsapp.models import SlotWrite
from tests.locks.conftest import TICK, register, reschedule

HOST_JOBS = ["write_slot", "record", "refuse", "linger", "slow_write"]
WITH_BUILTIN = [*HOST_JOBS, "check_jobs"]  # the locks app registers check_jobs itself (locks/registry.py)


def test_only_schedule_and_callable_are_required(settings):
    settings.LOCKS_DEFAULT_TTL = 240
    register(settings, minimal={"schedule": "0 3 * * *", "callable": "tests.jobsapp.jobs.record"})
    job = get_job("minimal")
    assert (job.ttl, job.max_run_time, job.retry_delays) == (timedelta(minutes=4), None, ())
    assert (job.expected_errors, job.dry_run_path) == ((), None)


def test_the_registry_is_validated_once_until_a_setting_changes(settings):
    """Issue 36, item 5: every ask reads the registry (run_job, the trigger, the scheduler's
    children); it is read and validated once per process, and again after a LOCKS_* change."""
    register(settings, minimal={"schedule": "0 3 * * *", "callable": "tests.jobsapp.jobs.record"})
    assert {get_job("minimal").ttl for _ in range(100)} == {timedelta(seconds=settings.LOCKS_DEFAULT_TTL)}
    assert _registry.cache_info()[:2] == (99, 1)  # hits, misses: validated once for 100 asks

    settings.LOCKS_DEFAULT_TTL = 4321  # the default of the entry's ttl: forgotten, read again
    assert _registry.cache_info()[:2] == (0, 0)
    assert get_job("minimal").ttl == timedelta(seconds=4321)


def test_jobs_keep_the_order_of_the_setting(settings):
    register(settings, early={"schedule": "0 3 * * *", "callable": "tests.jobsapp.jobs.record"})
    assert list(jobs()) == [*HOST_JOBS, "early", "check_jobs"]


def test_an_unknown_job_lists_the_registered_ones(settings):
    with pytest.raises(UnknownJob) as unknown:
        get_job("recrod")
    assert str(unknown.value) == (
        "no job named 'recrod' in LOCKS_JOBS (registered: write_slot, record, refuse, linger, slow_write, check_jobs)"
    )
    settings.LOCKS_JOBS, settings.LOCKS_CHECK_JOBS = {}, False
    with pytest.raises(UnknownJob, match=r"\(registered: none\)"):
        get_job("record")


def test_an_invalid_setting_is_refused_with_its_first_problem(settings):
    settings.LOCKS_JOBS = {"a": {"schedule": "every hour", "callable": "x.y", "ttl": 0}}
    with pytest.raises(ImproperlyConfigured) as refused:
        jobs()
    assert str(refused.value) == (
        "LOCKS_JOBS['a']: schedule 'every hour' is not a valid cron expression. "
        "(and 1 more: run `python manage.py check`)"
    )
    settings.LOCKS_JOBS = [("a", {})]
    with pytest.raises(ImproperlyConfigured, match=r"^LOCKS_JOBS must be a dict of job name to job settings"):
        get_job("a")


def test_reading_the_registry_imports_nothing(settings):
    register(settings, later={"schedule": "0 * * * *", "callable": "not_a_module_yet.run"})
    job = get_job("later")  # the system check (locks.E012) is what refuses it
    assert job.callable_path == "not_a_module_yet.run"
    with pytest.raises(ImportError):
        job.function()


# --- running a registered job ---------------------------------------------------------


@pytest.fixture
def registered(transactional_db):
    """The host project's jobs (tests/hostproject/settings.py), on a database that commits."""


def test_run_job_claims_the_current_tick_and_records_the_stats(registered):
    before = get_job("record").current_tick()
    result = run_job(name="record")
    assert (result.outcome, result.stats) == ("succeeded", {"recorded": 1, "ttl": 60})
    assert result.tick in {before, get_job("record").current_tick()}
    run = JobRun.objects.get()
    assert (run.job_name, run.tick, run.stats, run.token) == (
        "record",
        result.tick,
        {"recorded": 1, "ttl": 60},
        result.token,
    )
    assert run_job(name="record", tick=result.tick).outcome == "skipped"  # that slot succeeded


def test_force_claims_no_tick(registered):
    assert run_job(name="record", tick=TICK).outcome == "succeeded"
    result = run_job(name="record", force=True)
    assert (result.outcome, result.tick) == ("succeeded", None)
    assert SyncLock.objects.get(job_name="record").tick == TICK  # the claimed slot stays
    assert list(JobRun.objects.order_by("started_at").values_list("tick", flat=True)) == [TICK, None]


def test_an_expected_error_is_a_failure_without_a_traceback(registered, caplog):
    caplog.set_level(logging.INFO, logger="locks")
    result = run_job(name="refuse", force=True)
    assert (result.outcome, result.failure.error) == ("failed_expected", "nothing to record today")
    [record] = [r for r in caplog.records if r.name == "locks.api"]
    assert record.levelno == logging.ERROR and record.exc_info is None
    assert JobRun.objects.get().error == "nothing to record today"


def test_an_explicit_tick_must_be_a_slot(registered):
    with pytest.raises(InvalidTick) as refused:
        run_job(name="record", tick=TICK + timedelta(minutes=2))
    assert str(refused.value) == (
        "tick 2026-11-30T14:02:00+00:00 is not a slot of the schedule '*/5 * * * *' (UTC); "
        "the nearest valid slots are 2026-11-30T14:00:00+00:00 and 2026-11-30T14:05:00+00:00"
    )
    with pytest.raises(InvalidTick, match=r"^force and tick exclude each other"):
        run_job(name="record", tick=TICK, force=True)
    assert not SyncLock.objects.exists()


def test_an_explicit_tick_too_far_ahead_is_refused_by_the_lease_naming_the_slots(registered, caplog):
    """The compare-and-set judges on the database clock; its refusal of a tick the caller
    named beyond the tick window (a quarter of */5's gap: 75 s) becomes InvalidTick, with
    the slots a run may name."""
    db_now = database_now()
    too_far = Schedule("*/5 * * * *").next_slot(db_now + timedelta(minutes=2))

    with pytest.raises(InvalidTick) as refused:
        run_job(name="record", tick=too_far)

    message = str(refused.value)
    prefix = (
        f"tick {too_far.isoformat()} is more than the tick window (0:01:15) ahead of the database clock ("
    )
    assert message.startswith(prefix), message
    shown = datetime.fromisoformat(message[len(prefix) :].split(")")[0])
    assert abs(shown - db_now) < timedelta(minutes=1)
    slot = schedule.Schedule("*/5 * * * *").tick_ahead_message(
        too_far, db_now=shown, horizon=timedelta(seconds=75), window=timedelta(minutes=5)
    )
    assert message.split("); ")[1] == slot.split("); ")[1]
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert f"outcome=skipped reason=tick {too_far.isoformat()} is more than 0:01:15 ahead" in warning
    assert not SyncLock.objects.exists() and not JobRun.objects.exists()


def test_a_current_tick_too_far_ahead_is_a_skip_not_an_error(registered, monkeypatch):
    """A host whose clock is a day fast names tomorrow's slot itself: skipped, exit 0."""
    on_time = timezone.now()
    monkeypatch.setattr(timezone, "now", lambda: on_time + timedelta(days=1))
    result = run_job(name="record")

    assert (result.outcome, result.skip.reason) == ("tick_ahead", "tick_ahead")
    assert not SyncLock.objects.exists()


def test_a_copy_five_minutes_fast_takes_no_slot_of_a_burst_from_the_others(registered, settings, monkeypatch):
    """Issue 35, item 13: six minutely slots an hour (as `54-59 0 * * *` a day), the first at the
    database's minute. Was: the fast copy claimed the burst's last slot five minutes early (its future
    bound was the gap after that slot, 55 minutes), and the others' asks for the first five skipped
    ("a later tick ... was already claimed"): five missed, one run early."""
    first = database_now().replace(second=0, microsecond=0)
    burst = ",".join(str((first.minute + minute) % 60) for minute in range(6))
    reschedule(settings, "write_slot", f"{burst} * * * *")
    on_time = timezone.now()
    monkeypatch.setattr(timezone, "now", lambda: on_time + timedelta(minutes=5))

    fast = run_job(name="write_slot")
    monkeypatch.undo()
    honest = run_job(name="write_slot")

    last = first + timedelta(minutes=5)
    assert (fast.outcome, fast.skip.reason, fast.tick) == ("tick_ahead", "tick_ahead", last)
    assert "is more than 0:00:15 ahead of the database clock" in fast.reason
    assert honest.outcome == "succeeded" and honest.tick in {first, first + timedelta(minutes=1)}
    assert list(SlotWrite.objects.values_list("tick", flat=True)) == [honest.tick]


def test_the_schedulers_slot_is_never_claimed_before_its_time_on_the_database_clock(registered, settings):
    """The scheduler names the latest slot at or before its own clock (``due``): a slot ahead of the
    database clock is this host's fast clock, refused however near it is (the loop asks again then)."""
    reschedule(settings, "write_slot", "* * * * *")
    upcoming = Schedule("* * * * *").next_slot(database_now())

    result = run_job(name="write_slot", due=upcoming)

    assert (result.outcome, result.skip.reason, result.tick) == ("tick_ahead", "tick_ahead", upcoming)
    assert not SlotWrite.objects.exists()


def test_the_dry_run_callable_is_the_preview(registered):
    assert get_job("record").preview() == {"would_record": 1}
    with pytest.raises(
        NoDryRun, match=r"^job 'linger' has no dry run \(no 'dry_run' in its LOCKS_JOBS entry\)$"
    ):
        get_job("linger").preview()
    assert not JobRun.objects.exists()


# --- CRONJOBS: one line per job ---------------------------------------------------------


def test_the_host_project_builds_cronjobs_from_its_registry():
    assert cronjobs(host.LOCKS_JOBS, log_dir=host.VAR / "log") == host.CRONJOBS
    assert [line[2] for line in host.CRONJOBS] == [WITH_BUILTIN]


def test_one_cron_line_every_minute_asks_every_registered_job(tmp_path):
    log_dir = tmp_path / "a 100% odd dir"
    [line] = cronjobs({**host.LOCKS_JOBS, "broken": "not a dict"}, log_dir=log_dir)
    schedule, function, args, kwargs, suffix = line
    # Every minute whatever the host's zone; each pass runs `run_job NAME --requested-by cron` for
    # every job whose slot came in that minute, each appending to log_dir/NAME.log
    # (docs/deployment-cron.md).
    assert (schedule, function, args, kwargs) == (
        "* * * * *",
        "locks.crontab.run_due",
        WITH_BUILTIN,
        {"log_dir": str(log_dir)},
    )
    [without] = cronjobs(host.LOCKS_JOBS, log_dir=log_dir, check_jobs=False)  # LOCKS_CHECK_JOBS = False
    assert without[2] == HOST_JOBS
    # The pass's own output; shell-quoted, with cron's % escaped.
    assert suffix == f">> '{log_dir}/cron.log' 2>&1".replace("%", "\\%")
    assert cronjobs({}, log_dir=log_dir, check_jobs=False) == []


def test_a_new_process_reads_the_same_cron_line(transactional_db):
    """The settings a deployment would have, read in a new process: one line for every job."""
    code = "import django, json; django.setup(); from django.conf import settings; print(json.dumps(settings.CRONJOBS))"
    proc = subprocess.run(
        [sys.executable, "-c", code], cwd=ROOT, env=project_env(), capture_output=True, text=True, timeout=60
    )
    assert proc.returncode == 0, proc.stderr
    [line] = json.loads(proc.stdout)
    assert (line[0], line[2]) == ("* * * * *", [*HOST_JOBS, "check_jobs"])
    assert line[4] == f">> {host.VAR / 'log' / 'cron.log'} 2>&1"


# --- the app's own job ---------------------------------------------------------------------


def test_the_app_registers_check_jobs_unless_told_not_to_or_given_its_own(settings):
    job = get_job("check_jobs")
    assert (job.cron.expression, job.callable_path, job.ttl) == (
        "* * * * *",
        "locks.contrib.alerts.jobs.check_jobs",
        timedelta(minutes=2),
    )
    settings.LOCKS_JOBS = {
        **settings.LOCKS_JOBS,
        "check_jobs": {"schedule": "*/5 * * * *", "callable": "locks.contrib.alerts.jobs.check_jobs"},
    }
    assert get_job("check_jobs").cron.expression == "*/5 * * * *"  # the project's own entry wins
    settings.LOCKS_CHECK_JOBS = False
    settings.LOCKS_JOBS = {name: entry for name, entry in settings.LOCKS_JOBS.items() if name != "check_jobs"}
    assert list(jobs()) == HOST_JOBS
    with pytest.raises(UnknownJob):
        get_job("check_jobs")
