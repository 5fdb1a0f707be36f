"""`createsuperuser` in production refuses a password that fails the validators, on every
path (issue 21, item 5); with DJANGO_DEBUG=1 it is Django's own. Real processes, the
interactive ones on a pseudo-terminal (getpass reads the controlling terminal)."""

from __future__ import annotations

import fcntl
import os
import select
import subprocess
import sys
import termios
import time

import pytest
from django.contrib.auth import get_user_model

from tests.conftest import ROOT, manage, project_env
from tests.test_deploy_settings import production_env

STRONG = "correct-horse-battery-9"
pytestmark = pytest.mark.slow


@pytest.fixture
def env(db_url):
    return {"production": production_env(DATABASE_URL=db_url), "debug": project_env(DATABASE_URL=db_url)}


def _users() -> list[str]:
    return list(get_user_model().objects.values_list("username", flat=True))


@pytest.mark.parametrize(
    ("password", "email", "reason"),
    [
        ("1", "admin@contests.example", "This password is too short."),
        ("password123", "admin@contests.example", "This password is too common."),
        ("admin-contests-example", "admin@contests.example", "too similar to the email address"),
    ],
)
def test_noinput_in_production_refuses_a_weak_password_in_one_line(env, password, email, reason):
    extra = {"DJANGO_SUPERUSER_PASSWORD": password, "DJANGO_SUPERUSER_EMAIL": email}
    result = manage("createsuperuser", "--noinput", "--username", "admin", env={**env["production"], **extra})

    assert result.returncode == 2, result.stdout + result.stderr
    [line] = result.stderr.splitlines()
    assert line.startswith("CommandError: DJANGO_SUPERUSER_PASSWORD refused (with DJANGO_DEBUG=0 ")
    assert reason in line
    assert _users() == []


def test_noinput_in_production_takes_a_good_password(env):
    extra = {"DJANGO_SUPERUSER_PASSWORD": STRONG}
    result = manage(
        "createsuperuser", "--noinput", "--username", "admin", "--email", "a@contests.example",
        env={**env["production"], **extra},
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    assert result.stdout == "Superuser created successfully.\n"
    assert get_user_model().objects.get(username="admin").check_password(STRONG)


def test_noinput_with_debug_is_djangos_own(env):
    result = manage(
        "createsuperuser", "--noinput", "--username", "dev", "--email", "d@x.example",
        env={**env["debug"], "DJANGO_SUPERUSER_PASSWORD": "1"},
    )  # fmt: skip

    assert result.returncode == 0, result.stderr
    assert _users() == ["dev"]


def _converse(env: dict, steps: list[tuple[str, str]], *, timeout: float = 60) -> tuple[int, str]:
    """Run createsuperuser on a pseudo-terminal; for each (prompt, answer) wait until the
    output shows ``prompt`` (after the previous one), then type ``answer``."""
    master, slave = os.openpty()
    process = subprocess.Popen(
        [sys.executable, str(ROOT / "manage.py"), "createsuperuser"],
        cwd=ROOT,
        env=env,
        stdin=slave,
        stdout=slave,
        stderr=slave,
        start_new_session=True,
        preexec_fn=lambda: fcntl.ioctl(0, termios.TIOCSCTTY, 0),  # /dev/tty is this terminal
    )
    os.close(slave)
    output, seen, deadline = "", 0, time.monotonic() + timeout
    pending = list(steps)
    try:
        while time.monotonic() < deadline:
            ready, _, _ = select.select([master], [], [], 0.2)
            if ready:
                try:
                    chunk = os.read(master, 4096).decode(errors="replace")
                except OSError:  # the child closed the terminal
                    break
                if not chunk:
                    break
                output += chunk
            if pending and pending[0][0] in output[seen:]:
                prompt, answer = pending.pop(0)
                seen = output.index(prompt, seen) + len(prompt)
                os.write(master, answer.encode() + b"\n")
            if process.poll() is not None and not ready:
                break
        return process.wait(timeout=10), output
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
        os.close(master)


WEAK = [("Password: ", "1"), ("Password (again): ", "1")]
GOOD = [("Password: ", STRONG), ("Password (again): ", STRONG)]
NAME = [("Username", "admin"), ("Email address: ", "admin@contests.example")]


def test_interactive_in_production_never_offers_the_bypass(env):
    code, output = _converse(env["production"], [*NAME, *WEAK, *GOOD])

    assert code == 0, output
    assert "This password is too short." in output
    assert "Refused: with DJANGO_DEBUG=0 the password must pass every password validator" in output
    assert "Bypass password validation" not in output
    assert output.index("choose another.") < output.rindex("Password: ")  # asked again
    assert "Superuser created successfully." in output
    assert get_user_model().objects.get(username="admin").check_password(STRONG)


def test_interactive_with_debug_offers_djangos_bypass(env):
    code, output = _converse(env["debug"], [*NAME, *WEAK, ("Bypass password validation", "y")])

    assert code == 0, output
    assert "Superuser created successfully." in output
    assert get_user_model().objects.get(username="admin").check_password("1")
