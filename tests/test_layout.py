"""The shape of the code (issue 18): one front door per name, a locks app that knows no other
app of the project, and a locks app small and shallow enough to read (docs/architecture.md,
"Module map")."""

from __future__ import annotations

import ast
from functools import cache
from pathlib import Path

import pytest

from tests.conftest import ROOT

PROJECT = ("locks", "contests", "config", "tests", "bench", "scripts")
MAX_CHAIN = 5  # modules in the longest chain of imports inside locks/
MAX_LINES = 400  # lines of any module of locks/


def python_files(*tops: str) -> list[Path]:
    return sorted(
        path for top in tops for path in (ROOT / top).rglob("*.py") if "__pycache__" not in path.parts
    )


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def module_path(name: str) -> Path | None:
    base = ROOT.joinpath(*name.split("."))
    for candidate in (base.with_suffix(".py"), base / "__init__.py"):
        if candidate.exists():
            return candidate
    return None


@cache
def defined_names(path: Path) -> frozenset[str]:
    """What ``path`` defines itself at module level (functions, classes, assignments): not
    what it imports."""
    names = set()

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
                names.add(node.name)
            elif isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                names.update(n.id for t in targets for n in ast.walk(t) if isinstance(n, ast.Name))
            elif isinstance(node, ast.If | ast.Try | ast.With):
                visit(node.body)
                visit(getattr(node, "orelse", []))

    visit(ast.parse(path.read_text()).body)
    return frozenset(names)


def second_doors(source: str, where: str) -> list[str]:
    """``from locks.X import Y`` where Y is neither defined in locks.X nor a module of it."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not (isinstance(node, ast.ImportFrom) and node.module and node.level == 0):
            continue
        if node.module != "locks" and not node.module.startswith("locks."):
            continue
        path = module_path(node.module)
        if path is None:
            found.append(f"{where}:{node.lineno}: no module {node.module}")
            continue
        for alias in node.names:
            if alias.name not in defined_names(path) and module_path(f"{node.module}.{alias.name}") is None:
                found.append(f"{where}:{node.lineno}: {alias.name} is not defined in {node.module}")
    return found


def imported_modules(source: str) -> set[str]:
    """Every module an ``import`` or ``from … import`` names, at any depth of the code."""
    found = set()
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
            found.update(f"{node.module}.{alias.name}" for alias in node.names)
    return found


def test_every_name_is_imported_from_the_module_that_defines_it():
    found = [
        problem
        for path in python_files(*PROJECT)
        for problem in second_doors(path.read_text(), str(path.relative_to(ROOT)))
    ]
    assert found == []


def test_the_import_check_catches_a_second_door():
    assert second_doors("from locks.runner import Lease\nfrom locks.runner import run_locked\n", "x.py") == [
        "x.py:1: Lease is not defined in locks.runner"
    ]
    assert second_doors("from locks.api import acquire\n", "x.py") == ["x.py:1: no module locks.api"]
    assert second_doors("from locks.management.commands import run_job\n", "x.py") == []


def _outside(source: str, *forbidden: str) -> set[str]:
    return {name for name in imported_modules(source) if name.split(".")[0] in forbidden or name in forbidden}


def test_the_locks_app_imports_no_other_app_of_the_project():
    found = {
        str(path.relative_to(ROOT)): _outside(path.read_text(), "contests", "config", "tests", "bench")
        for path in python_files("locks")
    }
    assert {where: names for where, names in found.items() if names} == {}
    assert _outside("from contests.jobs import sync_contests\n", "contests") == {
        "contests.jobs",
        "contests.jobs.sync_contests",
    }


def test_the_locks_tests_use_the_host_project_never_contests_or_the_codeforces_stand_in():
    forbidden = (
        "contests",
        "config",
        "tests.contests",
        "tests.standin",
        "tests.smtp_standin",
        "tests.faults",
    )
    found = {}
    for path in python_files("tests/locks"):
        source = path.read_text()
        names = {
            n for n in imported_modules(source) if any(n == f or n.startswith(f + ".") for f in forbidden)
        }
        fixtures = {
            arg.arg
            for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.FunctionDef)
            for arg in node.args.args
            if arg.arg in {"standin", "payload", "outbox"}
        }
        if names | fixtures:
            found[str(path.relative_to(ROOT))] = names | fixtures
    assert found == {}


# --- the locks app: how deep its imports go, how long its modules are ---------------------


def locks_graph() -> dict[str, set[str]]:
    modules = {module_name(path): path for path in python_files("locks") if "migrations" not in path.parts}
    return {
        name: {m for m in imported_modules(path.read_text()) if m in modules and m not in {name, "locks"}}
        for name, path in modules.items()
    }


def longest_chain(graph: dict[str, set[str]]) -> list[str]:
    @cache
    def longest_from(name: str) -> tuple[str, ...]:
        chains = [longest_from(target) for target in graph[name]]
        return (name, *max(chains, key=len, default=()))

    return list(max((longest_from(name) for name in graph), key=len, default=()))


def test_the_longest_chain_of_imports_inside_locks_is_at_most_five_modules():
    chain = longest_chain(locks_graph())
    assert len(chain) <= MAX_CHAIN, " -> ".join(chain)
    assert len(chain) >= 3  # the measure sees the imports at all


def test_the_chain_measure_counts_modules():
    graph = {"a": {"b"}, "b": {"c"}, "c": set(), "d": {"c"}}
    assert longest_chain(graph) == ["a", "b", "c"]


@pytest.mark.parametrize("path", python_files("locks"), ids=lambda path: str(path.relative_to(ROOT)))
def test_no_module_of_locks_is_over_400_lines(path):
    assert len(path.read_text().splitlines()) <= MAX_LINES


# --- settings ------------------------------------------------------------------------------


def assigned_more_than_once(source: str) -> set[str]:
    """Upper-case names a module assigns at its top level (or in its top-level ifs) twice."""
    seen: list[str] = []

    def names(target: ast.expr) -> list[str]:  # NAME = …, A = B = …, (A, B) = …; not NAME[key] = …
        if isinstance(target, ast.Name):
            return [target.id] if target.id.isupper() else []
        if isinstance(target, ast.Tuple | ast.List):
            return [name for element in target.elts for name in names(element)]
        return []

    def visit(body: list[ast.stmt]) -> None:
        for node in body:
            if isinstance(node, ast.Assign | ast.AnnAssign | ast.AugAssign):
                targets = node.targets if isinstance(node, ast.Assign) else [node.target]
                seen.extend(name for target in targets for name in names(target))
            elif isinstance(node, ast.If):
                visit(node.body)
                visit(node.orelse)

    visit(ast.parse(source).body)
    return {name for name in seen if seen.count(name) > 1}


@pytest.mark.parametrize("path", ["config/settings.py", "tests/hostproject/settings.py"])
def test_every_setting_is_assigned_once(path):
    assert assigned_more_than_once((ROOT / path).read_text()) == set()


def test_the_assignment_check_can_fail():
    assert assigned_more_than_once("A = 1\nif x:\n    A = 2\nB = C = 3\nD = {}\nD['k'] = 1\n") == {"A"}
