"""Every package the project installs is pinned, transitive ones included, with hashes
(issue 21, item 11), and this environment runs exactly those versions."""

from __future__ import annotations

import re
from importlib.metadata import PackageNotFoundError, version

import pytest
from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.conftest import ROOT

PIN = re.compile(r"^([A-Za-z0-9._-]+)==([^\s\\]+)")


def _entries(name: str) -> dict[str, tuple[str, list[str]]]:
    """{package: (version, hashes)} of a compiled requirements file; every line that is
    not a comment or a hash continuation must be a pin."""
    entries, current = {}, None
    for line in (ROOT / name).read_text().splitlines():
        stripped = line.strip()
        if not stripped or stripped.startswith("#"):
            continue
        if stripped.startswith("--hash=sha256:"):
            assert current is not None, line
            entries[current][1].append(stripped.removeprefix("--hash=sha256:").rstrip(" \\"))
            continue
        match = PIN.match(stripped)
        assert match, f"{name}: not a pinned requirement: {line!r}"
        current = canonicalize_name(match[1])
        entries[current] = (match[2], [])
    return entries


def _direct(name: str) -> list[Requirement]:
    lines = (ROOT / name).read_text().splitlines()
    return [Requirement(line) for line in lines if line.strip() and not line.startswith(("#", "-"))]


WHEEL_SETS = ("requirements-wheel-django52", "requirements-wheel-django61")  # the host suite on the wheel


@pytest.mark.parametrize(
    "name", ["requirements.txt", "requirements-dev.txt", *(f"{s}.txt" for s in WHEEL_SETS)]
)
def test_every_package_is_pinned_with_a_hash(name):
    entries = _entries(name)
    assert len(entries) > 10  # the transitive packages too, not only the direct ones
    for package, (_pinned, hashes) in entries.items():
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", value) for value in hashes), package


@pytest.mark.parametrize(
    ("source", "compiled"),
    [
        ("requirements.in", "requirements.txt"),
        ("requirements-dev.in", "requirements-dev.txt"),
        *((f"{s}.in", f"{s}.txt") for s in WHEEL_SETS),
    ],
)
def test_the_compiled_files_satisfy_their_sources(source, compiled):
    entries = _entries(compiled)
    for requirement in _direct(source):
        pinned = entries[canonicalize_name(requirement.name)][0]
        assert requirement.specifier.contains(pinned, prereleases=True), (requirement, pinned)


def test_a_package_of_both_has_the_runtime_pin():
    runtime, dev = _entries("requirements.txt"), _entries("requirements-dev.txt")
    shared = runtime.keys() & dev.keys()
    assert "urllib3" in shared  # selenium needs it
    assert {package: dev[package][0] for package in shared} == {
        package: runtime[package][0] for package in shared
    }


def test_this_environment_runs_the_pinned_versions():
    pins = {**_entries("requirements-dev.txt"), **_entries("requirements.txt")}
    wrong = {}
    for package, (pinned, _hashes) in pins.items():
        try:
            installed = version(package)
        except PackageNotFoundError:
            installed = None
        if installed != pinned:
            wrong[package] = (pinned, installed)
    assert wrong == {}


def test_make_installs_with_require_hashes_and_setup_the_runtime_only():
    makefile = (ROOT / "Makefile").read_text()
    assert "PIP_INSTALL := $(BIN)/pip install --disable-pip-version-check -q --require-hashes" in makefile
    runtime = makefile.split("$(BIN)/.installed: requirements.txt", 1)[1].split("\n\n", 1)[0]
    assert "-r requirements.txt" in runtime and "requirements-dev" not in runtime
    assert "setup: $(BIN)/.installed\n" in makefile


def test_the_wheel_venvs_hold_the_wheels_dependencies_and_nothing_of_the_project():
    """Each set pins what the distribution needs (pyproject.toml) and the Django it is for; the
    Django 5.2 set has the project's pins, so the two suites test the same versions."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    needed = {canonicalize_name(Requirement(line).name) for line in project["dependencies"]}
    runtime = _entries("requirements.txt")
    for name, django in zip(WHEEL_SETS, ("5.2.", "6.1."), strict=True):
        entries = _entries(f"{name}.txt")
        assert needed <= entries.keys(), name
        assert entries["django"][0].startswith(django)
        assert not {"django-axes", "pymongo", "whitenoise", "contests"} & entries.keys()
    django52 = _entries("requirements-wheel-django52.txt")
    assert {p: v for p, (v, _h) in django52.items() if p in runtime} == {
        p: runtime[p][0] for p in django52.keys() & runtime.keys()
    }


def test_the_project_pins_what_the_locks_distribution_and_its_extras_need():
    """The project runs locks from the tree: its runtime pins stand for `django-tick-locks[...]`."""
    import tomllib

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    runtime = _entries("requirements.txt")
    extras = project["optional-dependencies"]
    assert set(extras) == {"prometheus", "crontab", "postgres", "mongodb", "tasks"}
    # The extra [tasks] is the host project's tests' (tests/locks/test_tasks.py): development pins it.
    development = _entries("requirements-dev.txt")
    assert all(development.get(canonicalize_name(Requirement(r).name)) for r in extras.pop("tasks"))
    wanted = [
        Requirement(line) for line in [*project["dependencies"], *(r for e in extras.values() for r in e)]
    ]
    assert len(wanted) == 6
    unmet = {
        str(r): runtime.get(canonicalize_name(r.name), ("missing",))[0]
        for r in wanted
        if canonicalize_name(r.name) not in runtime
        or not r.specifier.contains(runtime[canonicalize_name(r.name)][0])
    }
    assert unmet == {}
