"""django-crontab installs the line (every minute: it runs the jobs whose slot came in that
minute) with an absolute interpreter path; the line carries no secret value: it sources the
file `manage.py crontab_env` wrote (mode 0600)."""

import os
import secrets
import shlex
import shutil
import stat
import subprocess
import sys
from datetime import UTC, datetime

import pytest

from tests.conftest import ROOT, manage, own_crontab_held, project_env, run_as_cron, shell_command

pytestmark = pytest.mark.skipif(
    shutil.which("crontab") is None, reason="needs `crontab` from Debian's cron package (.ci/run installs it)"
)


@pytest.fixture
def saved_crontab():
    """Keep the user's crontab and put it back afterwards, whatever happens, holding it from
    the other suite's tests meanwhile (`own_crontab_held`)."""
    with own_crontab_held():
        before = subprocess.run(["crontab", "-l"], capture_output=True, text=True)
        try:
            yield
        finally:
            if before.returncode == 0:
                subprocess.run(["crontab", "-"], input=before.stdout, text=True, check=True)
            else:
                subprocess.run(["crontab", "-r"], capture_output=True)


def installed_lines() -> list[str]:
    return [
        line
        for line in subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout.splitlines()
        if "django-cronjobs" in line
    ]


def installed_line() -> str:
    """The one line: every registered job (the sync, the reminders, check_jobs) each minute."""
    [line] = installed_lines()
    return line


def test_add_show_remove(saved_crontab, tmp_path):
    env_file = tmp_path / "crontab.env"
    env = project_env(SYNC_CONTESTS_SCHEDULE="15 * * * *", DJANGO_CRONTAB_ENV_FILE=str(env_file))

    written = manage("crontab_env", env=env)
    added = manage("crontab", "add", env=env)
    installed = subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout
    shown = manage("crontab", "show", env=env)
    removed = manage("crontab", "remove", env=env)
    after = subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout

    assert written.returncode == 0, written.stderr
    assert added.returncode == 0, added.stderr
    lines = [line for line in installed.splitlines() if "django-cronjobs" in line]
    [line] = lines  # every minute, for every registered job: the sync, the reminders, check_jobs
    assert line.startswith(
        f"* * * * * umask 027; set -a; . {env_file}; set +a; {sys.executable} {ROOT / 'manage.py'} crontab run "
    )
    assert "SYNC_CONTESTS_SCHEDULE" not in line  # in the file, not in the line
    assert "SYNC_CONTESTS_SCHEDULE='15 * * * *'" in env_file.read_text()
    assert line.endswith(f" >> {ROOT / 'var' / 'cron.log'} 2>&1 # django-cronjobs for config")
    assert "'locks.crontab.run_due', ['sync_contests', 'send_reminders', 'check_jobs']" in shown.stdout
    assert removed.returncode == 0
    assert "django-cronjobs" not in after


def test_the_installed_line_carries_no_secret_value(saved_crontab, tmp_path):
    secret_key = "key-" + secrets.token_urlsafe(40)
    password = "pw-" + secrets.token_urlsafe(16)
    token = "tok-" + secrets.token_urlsafe(32)
    env_file = tmp_path / "crontab.env"
    env = project_env(
        DJANGO_SECRET_KEY=secret_key,
        DATABASE_URL=f"postgres://sync:{password}@db.internal:5432/app",
        LOCKS_TRIGGER_TOKEN=token,
        DJANGO_CRONTAB_ENV_FILE=str(env_file),
    )

    assert manage("crontab_env", env=env).returncode == 0
    assert manage("crontab", "add", env=env).returncode == 0
    crontab = subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout
    manage("crontab", "remove", env=env)

    assert "django-cronjobs" in crontab
    for value in (secret_key, password, token):
        assert value not in crontab
    assert stat.S_IMODE(os.stat(env_file).st_mode) == 0o600
    text = env_file.read_text()
    for value in (secret_key, password):
        assert value in text
    assert token not in text  # the trigger's token is the web process's, never a job's


def test_environment_values_survive_the_file_the_shell_and_cron(saved_crontab, tmp_path):
    url = "postgres://sync:p%40ss@db.internal:5432/app?sslmode=require&application_name=cron job"
    env_file = tmp_path / "a 100% awkward dir" / "crontab.env"  # quoted and %-escaped in the line
    env = project_env(DATABASE_URL=url, DJANGO_CRONTAB_ENV_FILE=str(env_file))

    assert manage("crontab_env", env=env).returncode == 0
    assert manage("crontab", "add", env=env).returncode == 0
    line = installed_line()
    manage("crontab", "remove", env=env)

    command = shell_command(line)
    assert f". {shlex.quote(str(env_file))};" in command
    prefix = command.split(f" {sys.executable} ")[0]
    echoed = subprocess.run(
        ["env", "-i", "PATH=/usr/bin:/bin", "sh", "-c", f"{prefix} printenv DATABASE_URL"],
        capture_output=True,
        text=True,
    )
    assert echoed.stdout.rstrip("\n") == url, echoed.stderr


def test_the_installed_line_runs_the_sync_in_crons_bare_environment(saved_crontab, db_url, standin, tmp_path):
    """At the sync's slot (under faketime: a pass runs the jobs whose slot came in its minute)."""
    from contests.models import Contest

    env = project_env(
        DATABASE_URL=db_url,
        CODEFORCES_API_URL=standin.url,
        DJANGO_CRONTAB_ENV_FILE=str(tmp_path / "crontab.env"),
        SYNC_CONTESTS_SCHEDULE="0 * * * *",
        SEND_REMINDERS_SCHEDULE="0 0 1 1 *",  # not due: this pass is the sync's alone
        LOCKS_CHECK_JOBS="0",
    )
    assert manage("crontab_env", env=env).returncode == 0
    assert manage("crontab", "add", env=env).returncode == 0
    line = installed_line()
    manage("crontab", "remove", env=env)
    log = ROOT / "var" / "sync_contests.log"
    written = log.stat().st_size if log.exists() else 0
    now = datetime.now(UTC)
    slot = now.replace(minute=0, second=3, microsecond=0)  # past: the database's clock is the real one
    command = f"faketime -f {round((slot - now).total_seconds()):+d} sh -c {shlex.quote(shell_command(line))}"

    ran = run_as_cron(command)

    assert ran.returncode == 0, ran.stderr
    output = log.read_text()[written:]
    assert "outcome=succeeded" in output, output
    assert stat.S_IMODE(os.stat(log).st_mode) & 0o007 == 0  # not world-readable
    assert standin.calls == 1
    assert Contest.objects.count() == 1758


def test_without_the_env_file_the_line_fails_loudly_and_runs_nothing(saved_crontab, standin, tmp_path):
    missing = tmp_path / "never-written.env"
    env = project_env(CODEFORCES_API_URL=standin.url, DJANGO_CRONTAB_ENV_FILE=str(missing))
    assert manage("crontab", "add", env=env).returncode == 0
    line = installed_line()
    manage("crontab", "remove", env=env)

    ran = subprocess.run(
        ["env", "-i", "PATH=/usr/bin:/bin", "sh", "-c", shell_command(line).split(" >> ")[0]],
        capture_output=True,
        text=True,
        timeout=60,
    )

    assert ran.returncode != 0
    assert str(missing) in ran.stderr  # cron mails this to the crontab's owner
    assert standin.calls == 0
