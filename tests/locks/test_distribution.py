"""The locks app as the distribution django-tick-locks (issue 38): under scripts/test-wheel.sh
(make test-wheel-django52 / -django61) this suite runs on the installed wheel, and these tests
prove it: `import locks` finds the wheel's, in this process and in the processes the suite
starts, and the wheel holds every file of the source tree's locks/."""

from __future__ import annotations

import os
import subprocess
import sys
import sysconfig
from importlib.metadata import distribution
from pathlib import Path

import pytest

import locks
from tests.conftest import ROOT, project_env

SOURCE = os.environ.get("LOCKS_WHEEL_SOURCE")
pytestmark = pytest.mark.skipif(
    not SOURCE, reason="runs on the installed wheel only: make test-wheel-django52 / test-wheel-django61"
)


def from_the_wheel(path: str) -> list[str]:
    """What is wrong with a `locks` imported from ``path``, if it is not the installed wheel's."""
    where = Path(path).resolve()
    problems = []
    if where.is_relative_to(Path(SOURCE).resolve()):
        problems.append(f"{where} is in the source tree")
    if not where.is_relative_to(Path(sysconfig.get_paths()["purelib"]).resolve()):
        problems.append(f"{where} is not in this environment's site-packages")
    return problems


def test_locks_is_the_installed_wheels_here_and_in_the_suites_processes():
    assert from_the_wheel(locks.__file__) == []
    assert not (ROOT / "locks").exists()  # the suite's root, on sys.path: a copy without locks/
    code = "import locks, django; print(locks.__file__)"
    done = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "shell", "-c", code],
        cwd=ROOT,
        env=project_env(),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    assert from_the_wheel(done.stdout.splitlines()[-1]) == []  # after the shell's own lines


def test_the_check_tells_the_source_tree_from_the_wheel():
    assert from_the_wheel(str(Path(SOURCE) / "__init__.py")) != []


def test_the_wheel_holds_every_file_of_the_source_tree():
    """Migrations of both apps, templates, static files, py.typed, commands, locks.contrib.alerts."""
    dist = distribution("django-tick-locks")
    installed = {  # pip's RECORD adds the .pyc files it compiled at install
        str(file) for file in dist.files if file.parts[0] == "locks" and "__pycache__" not in file.parts
    }
    source = {
        str(Path("locks") / path.relative_to(SOURCE))
        for path in Path(SOURCE).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert installed == source
    for expected in (
        "locks/py.typed",
        "locks/migrations/0001_initial.py",
        "locks/contrib/alerts/migrations/0001_initial.py",
        "locks/templates/admin/locks/synclock/change_list.html",
        "locks/static/locks/admin.css",
        "locks/management/commands/run_scheduler.py",
    ):
        assert expected in installed
    assert dist.metadata["Name"] == "django-tick-locks"
    classifiers = set(dist.metadata.get_all("Classifier"))
    assert {"Framework :: Django :: 5.2", "Framework :: Django :: 6.1", "Typing :: Typed"} <= classifiers
    requires = dist.requires or []
    assert any(r.startswith("Django>=") for r in requires) and any(r.startswith("croniter") for r in requires)
