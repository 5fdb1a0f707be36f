"""The host project wired to cron as docs/deployment-cron.md says: `crontab_env`, then
`crontab add` (django-crontab), one line a minute for the jobs of LOCKS_JOBS, which runs in
cron's bare environment, the jobs whose slot came in that minute. Each run of the line is a
real process under faketime at the minute cron would start it.

The lines go into the crontab of a throwaway OS user made for the test and deleted after
it (CRONTAB_EXECUTABLE is `crontab -u USER` there): the caller's own crontab is never
read or written.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shlex
import shutil
import stat
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from locks.models import JobRun
from tests.conftest import ROOT, manage, own_crontab_held, project_env, run_as_cron, shell_command
from tests.jobsapp.models import SlotWrite
from tests.locks.conftest import faketime_or_skip, offset_to

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(
        shutil.which("crontab") is None,
        reason="needs `crontab` from Debian's cron package (.ci/run installs it)",
    ),
    pytest.mark.skipif(
        os.geteuid() != 0 or shutil.which("useradd") is None,
        reason="needs root and useradd, to give the test a throwaway user whose crontab it may write",
    ),
]
JOBS = ["write_slot", "record", "refuse", "linger", "slow_write", "check_jobs"]  # check_jobs: the app's own


def crontab(*args: str, user: str | None = None, check: bool = True) -> subprocess.CompletedProcess:
    return subprocess.run(
        ["crontab", *(["-u", user] if user else []), *args],
        capture_output=True,
        text=True,
        check=check,
        timeout=30,
    )


@pytest.fixture
def cron_user():
    """A user that exists only for this test, with an empty crontab; deleted with it afterwards."""
    name = f"lockscron{secrets.token_hex(4)}"
    subprocess.run(
        ["useradd", "--no-create-home", "--shell", "/usr/sbin/nologin", name], check=True, timeout=30
    )
    try:
        pwd.getpwnam(name)
        yield name
    finally:
        crontab("-r", user=name, check=False)
        subprocess.run(["userdel", name], check=True, timeout=30)


def installed(user: str) -> list[str]:
    return [
        line
        for line in crontab("-l", user=user, check=False).stdout.splitlines()
        if "django-cronjobs" in line
    ]


def at(moment: datetime, command: str, *, tz: str = "UTC") -> str:
    """``command`` (what cron hands to sh) on a host whose clock reads ``moment``, in zone ``tz``."""
    return f"TZ={tz} faketime -f {offset_to(moment)} sh -c {shlex.quote(command)}"


def last_slot(step: int = 300) -> datetime:
    """The latest whole ``step`` seconds at or before now: a slot of ``*/5 * * * *`` (UTC)."""
    now = int(datetime.now(UTC).timestamp())
    return datetime.fromtimestamp(now - now % step, UTC)


def the_line(env: dict, user: str) -> str:
    assert manage("crontab_env", env=env).returncode == 0
    added = manage("crontab", "add", env=env, timeout=120)
    assert added.returncode == 0, added.stderr
    [line] = installed(user)
    return line


def host_env(db_url: str, tmp_path: Path, user: str, **extra: str) -> dict:
    return project_env(
        DATABASE_URL=db_url, HOSTPROJECT_VAR=str(tmp_path), HOSTPROJECT_CRONTAB_USER=user, **extra
    )


def test_crontab_add_installs_one_line_a_minute_that_runs_the_due_jobs_in_crons_bare_environment(
    cron_user, db_url, tmp_path
):
    faketime_or_skip()
    with own_crontab_held():  # while the project's suite may be writing and restoring it
        own_before = crontab("-l", check=False)
        env = host_env(
            db_url, tmp_path, cron_user, HOSTPROJECT_JOBS="write_slot record", HOSTPROJECT_CHECK_JOBS="0"
        )

        line = the_line(env, cron_user)

        host_manage = ROOT / "tests" / "hostproject" / "manage.py"
        assert line.startswith(
            f"* * * * * umask 027; set -a; . {tmp_path / 'crontab.env'}; set +a; "
            f"{sys.executable} {host_manage} crontab run "
        )
        assert line.endswith(f" >> {tmp_path / 'log' / 'cron.log'} 2>&1 # django-cronjobs for hostproject")
        assert db_url not in line  # in the 0600 file it sources, not in the line
        assert stat.S_IMODE((tmp_path / "crontab.env").stat().st_mode) == 0o600
        assert crontab("-l", check=False).stdout == own_before.stdout  # the caller's crontab untouched

    (tmp_path / "log").mkdir()
    slot = last_slot()
    ran = run_as_cron(at(slot + timedelta(seconds=3), shell_command(line)))  # both */5 jobs are due
    assert ran.returncode == 0, ran.stderr
    for job in ("write_slot", "record"):
        log = tmp_path / "log" / f"{job}.log"
        assert f"job={job} " in log.read_text() and "outcome=succeeded" in log.read_text(), log.read_text()
        assert stat.S_IMODE(log.stat().st_mode) == 0o640  # not world-readable
    assert list(SlotWrite.objects.values_list("job", "tick")) == [("write_slot", slot)]
    assert set(JobRun.objects.values_list("job_name", "tick", "requested_by")) == {
        ("write_slot", slot, "cron"),
        ("record", slot, "cron"),
    }
    assert (tmp_path / "log" / "cron.log").read_text() == ""  # the pass itself says nothing

    between = run_as_cron(at(slot + timedelta(seconds=63), shell_command(line)))  # no slot in that minute
    assert between.returncode == 0, between.stderr
    assert JobRun.objects.count() == 2

    removed = manage("crontab", "remove", env=env, timeout=120)
    assert removed.returncode == 0, removed.stderr
    assert installed(cron_user) == []


def test_the_line_asks_every_registered_job(cron_user, db_url, tmp_path):
    """`crontab run HASH` of the line is `run_due` of every job: each due one's `run_job NAME`."""
    env = host_env(db_url, tmp_path, cron_user)
    the_line(env, cron_user)
    shown = manage("crontab", "show", env=env, timeout=120)

    assert shown.returncode == 0, shown.stderr
    assert f"'locks.crontab.run_due', {JOBS!r}" in shown.stdout, shown.stdout
    assert Path(tmp_path / "crontab.env").read_text().count("DJANGO_SETTINGS_MODULE=") == 1


def test_a_failed_run_from_cron_is_its_one_line_and_exit_1_not_a_traceback(cron_user, db_url, tmp_path):
    """django-crontab catches what a job raises (SystemExit too), logs a traceback and exits 0;
    the line's `locks.crontab.run_due` ends the process with run_job's own status instead."""
    faketime_or_skip()
    env = host_env(db_url, tmp_path, cron_user, HOSTPROJECT_JOBS="refuse", HOSTPROJECT_CHECK_JOBS="0")
    line = the_line(env, cron_user)
    (tmp_path / "log").mkdir()

    ran = run_as_cron(at(last_slot() + timedelta(seconds=3), shell_command(line)))

    log = (tmp_path / "log" / "refuse.log").read_text()
    assert ran.returncode == 1, log
    assert "Traceback" not in log and "Failed to complete cronjob" not in log, log
    assert "Traceback" not in (tmp_path / "log" / "cron.log").read_text()
    [record] = [entry for entry in log.splitlines() if "outcome=" in entry]
    assert " ERROR locks.api job=refuse " in record, record
    assert " outcome=failed " in record and " error=nothing to record today " in record, record


def test_a_job_started_from_an_env_file_others_can_read_refuses_in_one_line(cron_user, db_url, tmp_path):
    """The file holds the database password and the secret key: a job started from it while
    group or others can read it does not start (exit 2), and says how to mend it."""
    faketime_or_skip()
    env = host_env(db_url, tmp_path, cron_user, HOSTPROJECT_JOBS="record", HOSTPROJECT_CHECK_JOBS="0")
    line = the_line(env, cron_user)
    (tmp_path / "log").mkdir()
    env_file = tmp_path / "crontab.env"
    env_file.chmod(0o644)
    due = at(last_slot() + timedelta(seconds=3), shell_command(line))

    ran = run_as_cron(due)

    log = (tmp_path / "log" / "record.log").read_text()
    assert ran.returncode == 2, log
    assert log.splitlines() == [
        f"CommandError: the environment file {env_file} is readable by group or others (mode 0644): "
        f"run `chmod 600 {env_file}` or `manage.py crontab_env` again"
    ]
    assert not JobRun.objects.exists()

    env_file.chmod(0o600)
    assert run_as_cron(due).returncode == 0


# --- a host in Europe/Berlin on the DST nights of 2027 ------------------------------------

# (pass at, the jobs that run in it): nightly is 30 2 * * * and hourly 0 * * * *, in Europe/Berlin.
PASSES = [
    # 2027-03-28: 02:00 CET -> 03:00 CEST at 01:00Z. Cron on this host reads its lines in Berlin time.
    (datetime(2027, 3, 28, 0, 0, 3, tzinfo=UTC), {"hourly"}),  # 01:00 CET
    (datetime(2027, 3, 28, 0, 30, 3, tzinfo=UTC), set()),  # 01:30 CET
    (datetime(2027, 3, 28, 1, 0, 3, tzinfo=UTC), {"hourly", "nightly"}),  # 03:00 CEST: 02:30 did not exist
    (datetime(2027, 3, 28, 1, 30, 3, tzinfo=UTC), set()),  # 03:30 CEST
    # 2027-10-31: 03:00 CEST -> 02:00 CET at 01:00Z.
    (datetime(2027, 10, 31, 0, 0, 3, tzinfo=UTC), {"hourly"}),  # 02:00 CEST
    (datetime(2027, 10, 31, 0, 30, 3, tzinfo=UTC), {"nightly"}),  # 02:30 CEST, the first
    (datetime(2027, 10, 31, 1, 0, 3, tzinfo=UTC), {"hourly"}),  # 02:00 CET
    (datetime(2027, 10, 31, 1, 30, 3, tzinfo=UTC), set()),  # 02:30 CET, the second: not again
]


def test_on_a_berlin_host_the_line_runs_each_slot_within_a_minute_on_both_dst_nights(
    cron_user, db_url, tmp_path, database_clock_at
):
    """The line fires every minute whatever the host's zone (Debian's cron has no CRON_TZ), and
    each pass runs the jobs whose slot, in the job's own zone, came in the minute before."""
    faketime_or_skip()
    database_clock_at(datetime(2027, 11, 1, 12, 0, tzinfo=UTC))
    env = host_env(db_url, tmp_path, cron_user, BERLIN_JOBS="1", HOSTPROJECT_JOBS="nightly hourly")
    env["HOSTPROJECT_CHECK_JOBS"] = "0"
    line = the_line(env, cron_user)
    assert line.startswith("* * * * * ")
    (tmp_path / "log").mkdir()

    ran = []
    for moment, expected in PASSES:
        before = set(JobRun.objects.values_list("pk", flat=True))
        done = run_as_cron(at(moment, shell_command(line), tz="Europe/Berlin"))
        assert done.returncode == 0, (moment, done.stderr, (tmp_path / "log" / "cron.log").read_text())
        new = JobRun.objects.exclude(pk__in=before)
        assert {run.job_name for run in new} == expected, moment
        for run in new:
            assert run.status == "succeeded" and timedelta(0) <= moment - run.tick < timedelta(minutes=1)
            ran.append((run.job_name, run.tick))
    assert sorted(SlotWrite.objects.values_list("job", "tick")) == sorted(ran)
