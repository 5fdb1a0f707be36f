"""`manage.py sync_contests` as real processes: once per tick, exit codes, broken answers."""

import json
import logging
import re
import shutil
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.utils import timezone

from contests.models import Contest, Reminder
from locks.models import JobRun, SyncLock, database_now
from locks.registry import get_job
from locks.runner import run_job
from locks.schedule import InvalidTick, Schedule
from tests.conftest import ROOT, manage, project_env, spawn

TICK = "2026-11-30T14:00:00+00:00"
pytestmark = pytest.mark.slow


@pytest.fixture
def env(db_url, standin):
    return project_env(DATABASE_URL=db_url, CODEFORCES_API_URL=standin.url, CODEFORCES_READ_TIMEOUT="1")


def _errors(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " ERROR " in line]


def test_twelve_processes_one_tick_one_api_call(env, standin, tmp_path):
    procs = [spawn(["manage.py", "sync_contests", "--tick", TICK], env=env) for _ in range(12)]
    outputs = [proc.communicate(timeout=120) for proc in procs]

    assert [proc.returncode for proc in procs] == [0] * 12, outputs
    assert standin.calls == 1
    outcomes = [out.strip().split(" outcome=")[1].split()[0] for out, _ in outputs]
    assert sorted(outcomes) == ["skipped"] * 11 + ["succeeded"]
    assert Contest.objects.count() == 1758
    run = JobRun.objects.get()
    assert (run.status, run.stats["created"], run.tick.isoformat()) == ("succeeded", 1758, TICK)

    # Later copies in the same tick make no request at all.
    late = manage("sync_contests", "--tick", TICK, env=env)
    assert late.returncode == 0
    assert "outcome=skipped reason=tick 2026-11-30T14:00:00+00:00 already done by " in late.stdout
    assert standin.calls == 1


def test_one_info_line_per_run(env, standin):
    proc = manage("sync_contests", "--tick", TICK, env=env)

    assert proc.returncode == 0
    [line] = [line for line in proc.stderr.splitlines() if " locks.api " in line]
    assert " INFO locks.api job=sync_contests tick=2026-11-30T14:00:00+00:00 holder=" in line
    for part in (
        "outcome=succeeded",
        "fetched=1758",
        "created=1758",
        "updated=0",
        "unchanged=0",
        "invalid=0",
    ):
        assert part in line
    assert "removed=0 pruned=0 duration=" in line


def test_the_default_tick_is_the_current_slot(env, standin):
    before = get_job("sync_contests").current_tick()
    proc = manage("sync_contests", env=env)
    after = get_job("sync_contests").current_tick()

    assert proc.returncode == 0, proc.stderr
    assert SyncLock.objects.get().tick in {before, after}


def test_force_runs_again_in_a_claimed_tick_but_claims_nothing(env, standin):
    assert manage("sync_contests", "--tick", TICK, env=env).returncode == 0
    forced = manage("sync_contests", "--force", env=env)

    assert forced.returncode == 0, forced.stderr
    assert "tick=forced" in forced.stdout and "outcome=succeeded" in forced.stdout
    assert "unchanged=1758" in forced.stdout
    assert standin.calls == 2
    assert SyncLock.objects.get().tick.isoformat() == TICK
    assert list(JobRun.objects.order_by("started_at").values_list("tick", flat=True))[1] is None


def test_dry_run_writes_nothing_and_claims_no_tick(env, standin):
    proc = manage("sync_contests", "--dry-run", env=env)

    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == (
        "dry run, nothing written: fetched=1758 created=1758 updated=0 unchanged=0 invalid=0 removed=0 pruned=0"
    )
    assert not Contest.objects.exists()
    assert not SyncLock.objects.exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--tick", "noon"], "argument --tick: 'noon' is not an ISO 8601 date-time"),
        (["--force", "--tick", TICK], "CommandError: --force and --tick exclude each other"),
        (["--bogus"], "unrecognized arguments: --bogus"),
        (
            ["--tick", "2026-11-30T14:30:00+00:00"],
            "CommandError: --tick: tick 2026-11-30T14:30:00+00:00 is not a slot of the schedule '0 * * * *' "
            "(UTC); the nearest valid slots are 2026-11-30T14:00:00+00:00 and 2026-11-30T15:00:00+00:00",
        ),
        (
            ["--tick", "2026-11-30T15:30:00+01:00"],  # 14:30 UTC
            "tick 2026-11-30T14:30:00+00:00 is not a slot",
        ),
        (
            ["--tick", "2062-12-01T08:00:00+00:00"],
            "CommandError: --tick: tick 2062-12-01T08:00:00+00:00 is more than the tick window (0:05:00) "
            "ahead of the database clock (",
        ),
    ],
)
def test_bad_arguments_are_clear_and_change_nothing(env, standin, args, message):
    proc = manage("sync_contests", *args, env=env)

    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "Traceback" not in proc.stderr
    assert standin.calls == 0
    assert not SyncLock.objects.exists()
    assert not JobRun.objects.exists()


DAILY = "0 0 * * *"


def test_a_tick_within_the_tick_window_is_claimed_one_further_is_refused(env, standin):
    """A daily schedule, so that midnight is the only moment the slots shift under the test.
    Tomorrow's slot lies beyond the tick window (5 min) at any time of day; the latest slot a
    run may name is the one at or before now + 5 min."""
    env = {**env, "SYNC_CONTESTS_SCHEDULE": DAILY}
    now = database_now()
    upcoming, latest = (
        Schedule(DAILY).next_slot(now),
        Schedule(DAILY).slot_at_or_before(now + timedelta(minutes=5)),
    )

    refused = manage("sync_contests", "--tick", (upcoming + timedelta(days=1)).isoformat(), env=env)
    assert refused.returncode == 2, refused.stderr
    assert "is more than the tick window (0:05:00) ahead of the database clock" in refused.stderr
    assert f"the latest slot it may name is {latest.isoformat()}, " in refused.stderr
    assert "Traceback" not in refused.stderr
    assert standin.calls == 0
    assert not SyncLock.objects.exists()

    claimed = manage("sync_contests", "--tick", latest.isoformat(), env=env)
    assert claimed.returncode == 0, claimed.stderr
    assert f"tick={latest.isoformat()} " in claimed.stdout and "outcome=succeeded" in claimed.stdout
    assert SyncLock.objects.get().tick == latest


def test_a_tick_without_an_offset_is_utc(env, standin):
    proc = manage("sync_contests", "--tick", "2026-11-30T14:00", env={**env, "TZ": "Europe/Berlin"})

    assert proc.returncode == 0, proc.stderr
    assert f"tick={TICK} " in proc.stdout
    assert SyncLock.objects.get().tick.isoformat() == TICK


def test_a_tick_between_slots_names_the_nearest_slots_without_asking_the_database(settings):
    settings.LOCKS_JOBS = {"sync_contests": {**settings.LOCKS_JOBS["sync_contests"], "schedule": "0 * * * *"}}
    between = datetime(2062, 12, 1, 8, 30, tzinfo=UTC)

    with pytest.raises(InvalidTick) as refused:
        run_job(name="sync_contests", tick=between)  # no database access: the test has none

    assert str(refused.value) == (
        "tick 2062-12-01T08:30:00+00:00 is not a slot of the schedule '0 * * * *' (UTC); the nearest valid "
        "slots are 2062-12-01T08:00:00+00:00 and 2062-12-01T09:00:00+00:00"
    )


def test_a_slot_too_far_ahead_exits_2_naming_the_slots_a_run_may_claim(env, standin):
    """The bound is checked by the lock's compare-and-set on the database clock. The tick
    is more than two hours ahead, so it stays over the tick window at any time of day."""
    too_far = Schedule("0 * * * *").slot_at_or_before(database_now() + timedelta(hours=3))

    refused = manage("sync_contests", "--tick", too_far.isoformat(), env=env)

    assert refused.returncode == 2, refused.stderr
    [error] = [line for line in refused.stderr.splitlines() if line.startswith("CommandError")]
    prefix = (
        f"CommandError: --tick: tick {too_far.isoformat()} is more than the tick window (0:05:00) "
        "ahead of the database clock ("
    )
    assert error.startswith(prefix), error
    db_now = datetime.fromisoformat(error[len(prefix) :].split(")")[0])
    assert error == (
        f"{prefix}{db_now.isoformat()}); the latest slot it may name is "
        f"{Schedule('0 * * * *').slot_at_or_before(db_now + timedelta(minutes=5)).isoformat()}, "
        f"the one a run claims now is {get_job('sync_contests').current_tick(now=db_now).isoformat()}"
    )
    [warning] = [line for line in refused.stderr.splitlines() if " WARNING " in line]
    assert f"outcome=skipped reason=tick {too_far.isoformat()} is more than 0:05:00 ahead" in warning
    assert re.search(r"this host's clock is [+-]0 s off the database clock", warning), warning
    assert "Traceback" not in refused.stderr and refused.stdout == ""
    assert standin.calls == 0
    assert not SyncLock.objects.exists() and not JobRun.objects.exists()


def test_a_host_a_day_fast_is_refused_and_a_host_on_time_then_syncs(db, standin, monkeypatch, caplog):
    """Its tick is tomorrow's: more than the tick window ahead of the database clock. Nothing
    is stored, so the real tick is not blocked."""
    on_time = timezone.now()
    monkeypatch.setattr(timezone, "now", lambda: on_time + timedelta(days=1))
    fast = StringIO()
    call_command("sync_contests", stdout=fast)  # exit 0: a skip, not bad arguments

    assert "outcome=skipped reason=tick " in fast.getvalue()
    assert " is more than 0:05:00 ahead of the database clock " in fast.getvalue()
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert re.search(r"this host's clock is \+86\d\d\d s off the database clock", warning), warning
    assert standin.calls == 0 and not SyncLock.objects.exists()

    monkeypatch.setattr(timezone, "now", lambda: on_time)
    call_command("sync_contests", stdout=StringIO())
    assert JobRun.objects.get().status == "succeeded" and standin.calls == 1


def test_a_sync_is_ended_at_its_maximum_run_time(transactional_db, standin, settings):
    """A stalled answer: the fetch outlasts the maximum run time, so the run ends lost_lock
    before it writes (the fetch's own deadline is CODEFORCES_TOTAL_TIMEOUT)."""
    sync = {**settings.LOCKS_JOBS["sync_contests"], "ttl": 1, "max_run_time": 1}  # a beat every 1/3 s
    settings.LOCKS_JOBS = {**settings.LOCKS_JOBS, "sync_contests": sync}
    standin.delay = 1.5  # within the read timeout: the fetch succeeds, too late

    out = StringIO()
    with pytest.raises(SystemExit) as exited:
        call_command("sync_contests", "--tick", TICK, stdout=out)

    assert exited.value.code == 1
    assert "outcome=lost_lock" in out.getvalue()
    assert "error=ran longer than its maximum run time 0:00:01" in out.getvalue()
    assert not Contest.objects.exists()
    run = JobRun.objects.get()
    assert (run.status, run.error) == ("lost_lock", "ran longer than its maximum run time 0:00:01")


FALL_BACK = datetime(2026, 10, 25, 1, 0, tzinfo=UTC)  # Europe/Berlin: 03:00 CEST -> 02:00 CET


@pytest.mark.skipif(
    shutil.which("faketime") is None, reason="faketime (Debian package faketime) is not installed"
)
def test_two_hosts_forty_seconds_apart_at_the_fall_back_instant_sync_once(env, standin):
    """Clocks at 00:59:40 and 01:00:20 UTC, process TZ Europe/Berlin: one tick, one sync.

    On the wall clock these are 02:59:40 CEST and 02:00:20 CET. The offsets are relative
    (``faketime -f -Ns``): an absolute ``@…`` time would be read in the process's TZ.
    """
    env = {**env, "TZ": "Europe/Berlin"}
    procs = []
    for moment in (FALL_BACK - timedelta(seconds=20), FALL_BACK + timedelta(seconds=20)):
        offset = round((moment - datetime.now(UTC)).total_seconds())
        command = ["faketime", "-f", f"{offset:+d}", sys.executable, str(ROOT / "manage.py"), "sync_contests"]
        procs.append(subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120))

    first, second = procs
    assert first.returncode == 0 and second.returncode == 0, (first.stderr, second.stderr)
    assert f"tick={FALL_BACK.isoformat()} " in first.stdout and "outcome=succeeded" in first.stdout
    assert f"tick={FALL_BACK.isoformat()} " in second.stdout
    assert f"outcome=skipped reason=tick {FALL_BACK.isoformat()} already done by " in second.stdout
    assert standin.calls == 1
    assert list(JobRun.objects.values_list("tick", "status")) == [(FALL_BACK, "succeeded")]


def _stock(django_user_model):
    """A database after one good sync, with a reminder on a finished contest."""
    user = django_user_model.objects.create(username="ann")
    contest = Contest.objects.filter(phase="FINISHED").first()
    Reminder.objects.create(user=user, contest=contest, remind_at=contest.start_time)


BROKEN = {
    "http-500": lambda s: (setattr(s, "status", 500), s.set_payload(b"Internal Server Error")),
    "failed-status": lambda s: s.set_payload({"status": "FAILED", "comment": "contestId: Contest not found"}),
    "call-limit-every-time": lambda s: (
        setattr(s, "status", 400),
        s.set_payload({"status": "FAILED", "comment": "Call limit exceeded"}),
    ),
    "truncated-json": lambda s: s.set_payload(s.body[:5000]),
    "empty-list": lambda s: s.set_payload({"status": "OK", "result": []}),
    "not-a-list": lambda s: s.set_payload({"status": "OK", "result": {"contests": []}}),
    "mostly-invalid": lambda s: s.set_payload(
        {
            "status": "OK",
            "result": [{"id": -i} for i in range(1, 50)]
            + [{"id": 1, "name": "x", "type": "CF", "phase": "BEFORE", "durationSeconds": 1}],
        }
    ),
    "over-size-cap": lambda s: s.set_payload(b'{"status":"OK","result":[' + b" " * 500_000 + b"]}"),
    "read-timeout": lambda s: setattr(s, "delay", 3),
}
MESSAGES = {
    "http-500": "answered HTTP 500",
    "failed-status": "answered status 'FAILED': contestId: Contest not found",
    "call-limit-every-time": "answered status 'FAILED': Call limit exceeded",
    "truncated-json": "body that is not JSON",
    "empty-list": "returned no contests while 1758 are stored",
    "not-a-list": "'result' is a dict, not a list of contests",
    "mostly-invalid": "mostly invalid: 49 of 50 entries rejected",
    "over-size-cap": "over the 400,000-byte cap",
    "read-timeout": "did not answer within 1 s",
}


@pytest.mark.parametrize("breakage", list(BROKEN))
def test_a_broken_answer_changes_nothing_and_exits_non_zero(env, standin, django_user_model, breakage):
    assert manage("sync_contests", "--tick", TICK, env=env).returncode == 0
    _stock(django_user_model)
    contests_before = list(Contest.objects.order_by("pk").values())
    reminders_before = list(Reminder.objects.values())
    BROKEN[breakage](standin)

    started = time.monotonic()
    proc = manage("sync_contests", "--force", env={**env, "CODEFORCES_MAX_BYTES": "400000"})

    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    [error] = _errors(proc.stderr)
    assert "job=sync_contests tick=forced" in error and "outcome=failed" in error
    assert MESSAGES[breakage] in error
    assert list(Contest.objects.order_by("pk").values()) == contests_before
    assert list(Reminder.objects.values()) == reminders_before
    run = JobRun.objects.latest("started_at")
    assert run.status == "failed" and MESSAGES[breakage] in run.error
    assert SyncLock.objects.get().locked_until is None  # released, not left to expire
    assert time.monotonic() - started < 60  # hang guard only


def test_call_command_reports_through_stdout(db, standin):
    out = StringIO()
    call_command("sync_contests", "--tick", TICK, stdout=out)

    assert out.getvalue().startswith("job=sync_contests tick=2026-11-30T14:00:00+00:00 holder=")
    assert "outcome=succeeded" in out.getvalue()
    call_command("sync_contests", "--tick", TICK, stdout=out, verbosity=0)
    assert out.getvalue().count("\n") == 1


def test_locks_status_json_after_a_run(env, standin):
    manage("sync_contests", "--tick", TICK, env=env)
    proc = manage("locks", "status", "--json", env=env)

    by_job = {row["job"]: row for row in json.loads(proc.stdout)}
    # Every registered job, run or not: the locks app's own check_jobs too.
    assert sorted(by_job) == ["check_jobs", "send_reminders", "sync_contests"]
    lock, reminders = by_job["sync_contests"], by_job["send_reminders"]
    assert (lock["job"], lock["state"], lock["last_status"], lock["tick"]) == (
        "sync_contests",
        "free",
        "succeeded",
        TICK,
    )
    assert (reminders["job"], reminders["state"], reminders["tick"]) == ("send_reminders", "never run", None)


def test_sigterm_mid_sync_releases_the_lease_and_writes_nothing(env, standin):
    import signal

    standin.delay = 30  # the fetch hangs; the run is stopped meanwhile
    proc = spawn(["manage.py", "sync_contests", "--tick", TICK], env=env)
    deadline = time.monotonic() + 60
    while standin.calls == 0 and time.monotonic() < deadline:
        time.sleep(0.05)
    proc.send_signal(signal.SIGTERM)
    _out, err = proc.communicate(timeout=60)

    assert proc.returncode == 128 + signal.SIGTERM, err
    assert "Traceback" not in err
    assert "outcome=failed" in err and "error=interrupted: SystemExit: 143" in err
    lock = SyncLock.objects.get()
    assert (lock.locked_until, lock.last_status) == (None, "failed")
    assert not Contest.objects.exists()
