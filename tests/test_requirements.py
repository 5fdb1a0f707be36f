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


@pytest.mark.parametrize("name", ["requirements.txt", "requirements-dev.txt"])
def test_every_package_is_pinned_with_a_hash(name):
    entries = _entries(name)
    assert len(entries) > 10  # the transitive packages too, not only the direct ones
    for package, (_pinned, hashes) in entries.items():
        assert hashes and all(re.fullmatch(r"[0-9a-f]{64}", value) for value in hashes), package


@pytest.mark.parametrize(
    ("source", "compiled"),
    [("requirements.in", "requirements.txt"), ("requirements-dev.in", "requirements-dev.txt")],
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
