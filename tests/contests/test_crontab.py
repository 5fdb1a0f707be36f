"""django-crontab installs the hourly line with an absolute interpreter path."""

import shutil
import subprocess
import sys

import pytest

from tests.conftest import ROOT, manage, project_env

pytestmark = pytest.mark.skipif(
    shutil.which("crontab") is None, reason="needs `crontab` from Debian's cron package (.ci/run installs it)"
)


@pytest.fixture
def saved_crontab():
    """Keep the user's crontab and put it back afterwards, whatever happens."""
    before = subprocess.run(["crontab", "-l"], capture_output=True, text=True)
    yield
    if before.returncode == 0:
        subprocess.run(["crontab", "-"], input=before.stdout, text=True, check=True)
    else:
        subprocess.run(["crontab", "-r"], capture_output=True)


def test_add_show_remove(saved_crontab):
    env = project_env(SYNC_CONTESTS_SCHEDULE="15 * * * *")

    added = manage("crontab", "add", env=env)
    installed = subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout
    shown = manage("crontab", "show", env=env)
    removed = manage("crontab", "remove", env=env)
    after = subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout

    assert added.returncode == 0, added.stderr
    [line] = [line for line in installed.splitlines() if "django-cronjobs" in line]
    assert line.startswith("15 * * * * ")
    assert "SYNC_CONTESTS_SCHEDULE='15 * * * *'" in line
    assert f"{sys.executable} {ROOT / 'manage.py'} crontab run " in line
    assert f">> {ROOT / 'var' / 'sync_contests.log'} 2>&1" in line
    assert "'sync_contests'" in shown.stdout
    assert removed.returncode == 0
    assert "django-cronjobs" not in after


def test_environment_values_survive_the_shell_and_cron(saved_crontab):
    url = "postgres://sync:p%40ss@db.internal:5432/app?sslmode=require&application_name=cron job"
    env = project_env(DATABASE_URL=url)

    assert manage("crontab", "add", env=env).returncode == 0
    [line] = [
        line
        for line in subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout.splitlines()
        if "django-cronjobs" in line
    ]
    manage("crontab", "remove", env=env)

    command = line.split(" ", 5)[5].split(" # django-cronjobs")[0]
    assert "%" not in command.replace("\\%", "")  # cron would cut the line at a bare %
    prefix = command.split(f" {sys.executable} ")[0].replace("\\%", "%")  # what cron hands to sh
    echoed = subprocess.run(["sh", "-c", f"{prefix} printenv DATABASE_URL"], capture_output=True, text=True)
    assert echoed.stdout.rstrip("\n") == url


def test_the_installed_line_runs_the_sync_in_crons_bare_environment(saved_crontab, db_url, standin):
    from contests.models import Contest

    env = project_env(DATABASE_URL=db_url, CODEFORCES_API_URL=standin.url)
    assert manage("crontab", "add", env=env).returncode == 0
    [line] = [
        line
        for line in subprocess.run(["crontab", "-l"], capture_output=True, text=True).stdout.splitlines()
        if "django-cronjobs" in line
    ]
    command = line.split(" ", 5)[5].split(" >> ")[0].replace("\\%", "%")

    # cron runs the line with sh and almost no environment.
    ran = subprocess.run(
        ["env", "-i", "PATH=/usr/bin:/bin", "sh", "-c", command], capture_output=True, text=True, timeout=120
    )

    assert ran.returncode == 0, ran.stderr
    assert "outcome=succeeded" in ran.stderr
    assert standin.calls == 1
    assert Contest.objects.count() == 1758
