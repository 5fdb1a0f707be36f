"""The locks app as the distribution django-tick-locks (pyproject.toml): the docs name the wheel
that `make wheel` builds, and `make test` runs the host suite on it under each Django."""

from __future__ import annotations

import re
import tomllib

import pytest

from tests.conftest import ROOT

PROJECT = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]


def wheel_names(text: str) -> set[str]:
    return set(re.findall(r"django_tick_locks-[^\s'\"\[\]`]+\.whl", text))


@pytest.mark.parametrize("doc", ["README.md", "docs/jobs.md"])
def test_the_docs_name_the_wheel_of_this_version(doc):
    assert wheel_names((ROOT / doc).read_text()) == {
        f"django_tick_locks-{PROJECT['version']}-py3-none-any.whl"
    }


def test_the_wheel_name_check_can_fail():
    assert wheel_names("pip install 'dist/django_tick_locks-0.9-py3-none-any.whl[crontab]'") == {
        "django_tick_locks-0.9-py3-none-any.whl"
    }


def test_make_test_runs_the_host_suite_on_the_wheel_under_each_django():
    makefile = (ROOT / "Makefile").read_text()
    sqlite = makefile.split("\ntest-sqlite-host:", 1)[1].split("\n\n", 1)[0]
    postgres = makefile.split("\ntest-postgres-host:", 1)[1].split("\n\n", 1)[0]
    test = makefile.split("\ntest:", 1)[1].split("\n\n", 1)[0]
    assert "test-sqlite-host" in test and "test-postgres-host" in test
    assert "scripts/test-wheel.sh $(WHEEL_VENVS)/django61" in sqlite
    assert "scripts/test-wheel.sh $(WHEEL_VENVS)/django52" in postgres
    assert "--ds tests.hostproject.settings" not in sqlite + postgres  # no run on the source tree
    classifiers = set(PROJECT["classifiers"])
    assert {"Framework :: Django :: 5.2", "Framework :: Django :: 6.1"} <= classifiers
