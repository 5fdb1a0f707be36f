"""The host project wired to cron as docs/deployment-cron.md says: `crontab_env`, then
`crontab add` (django-crontab), one line per job of LOCKS_JOBS, which runs in cron's bare
environment.

The lines go into the crontab of a throwaway OS user made for the test and deleted after
it (CRONTAB_EXECUTABLE is `crontab -u USER` there): the caller's own crontab is never
read or written.
"""

from __future__ import annotations

import os
import pwd
import secrets
import shutil
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from locks.models import JobRun
from tests.conftest import ROOT, manage, project_env, run_as_cron, shell_command
from tests.jobsapp.models import SlotWrite

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
TICK = "2026-11-30T14:00:00+00:00"
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


def test_crontab_add_installs_one_line_per_job_that_runs_in_crons_bare_environment(
    cron_user, db_url, tmp_path
):
    own_before = crontab("-l", check=False)
    env = project_env(DATABASE_URL=db_url, HOSTPROJECT_VAR=str(tmp_path), HOSTPROJECT_CRONTAB_USER=cron_user)

    written = manage("crontab_env", env=env)
    added = manage("crontab", "add", env=env, timeout=120)
    lines = installed(cron_user)

    assert written.returncode == 0, written.stderr
    assert added.returncode == 0, added.stderr
    assert len(lines) == len(JOBS), lines  # one per registered job
    [line] = [line for line in lines if "/write_slot.log " in line]
    host_manage = ROOT / "tests" / "hostproject" / "manage.py"
    assert line.startswith(
        f"*/5 * * * * umask 027; set -a; . {tmp_path / 'crontab.env'}; set +a; "
        f"{sys.executable} {host_manage} crontab run "
    )
    assert line.endswith(f" >> {tmp_path / 'log' / 'write_slot.log'} 2>&1 # django-cronjobs for hostproject")
    assert db_url not in line  # in the 0600 file it sources, not in the line
    assert stat.S_IMODE((tmp_path / "crontab.env").stat().st_mode) == 0o600
    assert crontab("-l", check=False).stdout == own_before.stdout  # the caller's crontab untouched

    (tmp_path / "log").mkdir()
    ran = run_as_cron(shell_command(line))

    assert ran.returncode == 0, ran.stderr
    log = tmp_path / "log" / "write_slot.log"
    assert "job=write_slot" in log.read_text() and "outcome=succeeded" in log.read_text(), log.read_text()
    assert stat.S_IMODE(log.stat().st_mode) == 0o640  # not world-readable
    assert SlotWrite.objects.filter(job="write_slot").count() == 1
    assert JobRun.objects.get(job_name="write_slot").requested_by == "cron"

    removed = manage("crontab", "remove", env=env, timeout=120)
    assert removed.returncode == 0, removed.stderr
    assert installed(cron_user) == []


def test_the_line_is_the_run_job_command_of_its_job(cron_user, db_url, tmp_path):
    """`crontab run HASH` of a line is `run_job NAME`: the same lease, the same tick rules."""
    env = project_env(DATABASE_URL=db_url, HOSTPROJECT_VAR=str(tmp_path), HOSTPROJECT_CRONTAB_USER=cron_user)
    assert manage("crontab_env", env=env).returncode == 0
    assert manage("crontab", "add", env=env, timeout=120).returncode == 0
    shown = manage("crontab", "show", env=env, timeout=120)

    assert shown.returncode == 0, shown.stderr
    for job in JOBS:
        assert f"'locks.crontab.run', ['{job}']" in shown.stdout, shown.stdout
    assert Path(tmp_path / "crontab.env").read_text().count("DJANGO_SETTINGS_MODULE=") == 1


def line_of(job: str, env: dict, user: str) -> str:
    assert manage("crontab_env", env=env).returncode == 0
    assert manage("crontab", "add", env=env, timeout=120).returncode == 0
    [line] = [line for line in installed(user) if f"/{job}.log " in line]
    return line


def test_a_failed_run_from_cron_is_its_one_line_and_exit_1_not_a_traceback(cron_user, db_url, tmp_path):
    """django-crontab catches what a job raises (SystemExit too), logs a traceback and exits 0;
    the line's `locks.crontab.run` ends the process with run_job's own status instead."""
    env = project_env(DATABASE_URL=db_url, HOSTPROJECT_VAR=str(tmp_path), HOSTPROJECT_CRONTAB_USER=cron_user)
    line = line_of("refuse", env, cron_user)
    (tmp_path / "log").mkdir()

    ran = run_as_cron(shell_command(line))

    log = (tmp_path / "log" / "refuse.log").read_text()
    assert ran.returncode == 1, log
    assert "Traceback" not in log and "Failed to complete cronjob" not in log, log
    [record] = [entry for entry in log.splitlines() if "outcome=" in entry]
    assert " ERROR locks.api job=refuse " in record, record
    assert " outcome=failed " in record and " error=nothing to record today " in record, record


def test_a_job_started_from_an_env_file_others_can_read_refuses_in_one_line(cron_user, db_url, tmp_path):
    """The file holds the database password and the secret key: a job started from it while
    group or others can read it does not start (exit 2), and says how to mend it."""
    env = project_env(DATABASE_URL=db_url, HOSTPROJECT_VAR=str(tmp_path), HOSTPROJECT_CRONTAB_USER=cron_user)
    line = line_of("record", env, cron_user)
    (tmp_path / "log").mkdir()
    env_file = tmp_path / "crontab.env"
    env_file.chmod(0o644)

    ran = run_as_cron(shell_command(line))

    log = (tmp_path / "log" / "record.log").read_text()
    assert ran.returncode == 2, log
    assert log.splitlines() == [
        f"CommandError: the environment file {env_file} is readable by group or others (mode 0644): "
        f"run `chmod 600 {env_file}` or `manage.py crontab_env` again"
    ]
    assert not SlotWrite.objects.exists()

    env_file.chmod(0o600)
    assert run_as_cron(shell_command(line)).returncode == 0
