"""The docs tell the truth about what they cite: every heading or anchor a link or a citation
names exists, and so does every setting, check id, command option and test name that README.md
and docs/*.md mention; docs/architecture.md's module map matches the tree."""

from __future__ import annotations

import ast
import importlib
import re
from functools import cache
from pathlib import Path

import pytest
from django.conf import global_settings
from django.core.management import get_commands, load_command_class

from tests.conftest import ROOT

DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
CODE = [
    path
    for top in ("locks", "contests", "config", "tests", "bench", "scripts")
    for path in sorted((ROOT / top).rglob("*.py"))
    if path != Path(__file__)  # its samples cite what does not exist, on purpose
]
# Ids that were renamed: named only where docs/deployment.md's "Upgrading" maps them to the new ones.
RETIRED_IDS = {"ops.E001", "ops.E002", "ops.W001", "ops.W002", "ops.W003"}
OUR_COMMANDS = ("run_job", "sync_contests", "send_reminders", "run_scheduler", "locks", "crontab_env")


def ids(path: Path) -> str:
    return str(path.relative_to(ROOT)) if path.is_relative_to(ROOT) else str(path)


def code_spans(text: str) -> list[str]:
    """Inline code, and each line of the fenced blocks."""
    spans = []
    for block in re.findall(r"```[^\n]*\n(.*?)```", text, flags=re.S):
        spans.extend(block.splitlines())
    spans.extend(re.findall(r"`([^`\n]+)`", re.sub(r"```.*?```", "", text, flags=re.S)))
    return spans


# --- headings and anchors ---------------------------------------------------------------


def anchor(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"[^\w\- ]", "", heading.replace("`", "").strip().lower())
    return text.replace(" ", "-")


@cache
def headings(path: Path) -> tuple[set[str], set[str]]:
    """(the headings' texts, their anchors) of a markdown file."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    titles = [line.lstrip("#").strip() for line in text.splitlines() if re.match(r"#{1,6} ", line)]
    anchors, seen = set(), {}
    for title in titles:
        slug = anchor(title)
        anchors.add(f"{slug}-{seen[slug]}" if slug in seen else slug)
        seen[slug] = seen.get(slug, 0) + 1
    return {title.replace("`", "").lower() for title in titles}, anchors


def broken_links(path: Path) -> list[str]:
    found = []
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # https://, mailto:
        file, _, fragment = target.partition("#")
        linked = (path.parent / file).resolve() if file else path
        if not linked.exists():
            found.append(f"{ids(path)}: {target}: no such file")
        elif fragment and linked.suffix == ".md" and fragment not in headings(linked)[1]:
            found.append(f"{ids(path)}: {target}: no such heading")
    return found


CITATION = re.compile(r"docs/([\w-]+\.md),? (?:\"([^\"]+)\"|([A-Z][^)\n;:,.\"]*))")


def broken_citations(path: Path) -> list[str]:
    """``docs/x.md, "Heading"`` (or ``docs/x.md, Heading``) in code and docs."""
    found = []
    for file, quoted, bare in CITATION.findall(path.read_text()):
        # A docstring may break a cited heading over two lines.
        doc, title = ROOT / "docs" / file, " ".join((quoted or bare).split())
        if not doc.exists():
            found.append(f"{ids(path)}: docs/{file}: no such file")
        elif title.replace("`", "").lower() not in headings(doc)[0]:
            found.append(f"{ids(path)}: docs/{file}, {title!r}: no such heading")
    return found


@pytest.mark.parametrize("path", DOCS, ids=ids)
def test_every_link_names_a_file_and_heading_that_exist(path):
    assert broken_links(path) == []


@pytest.mark.parametrize("path", DOCS + CODE, ids=ids)
def test_every_cited_heading_exists(path):
    assert broken_citations(path) == []


def test_the_heading_checks_can_fail(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text(
        "# A title\n\n## `run_scheduler` in every replica: Procfile\n\n[a](#nope) [b](#a-title) [c](y.md)\n"
    )
    assert broken_links(doc) == [
        f"{doc}: #nope: no such heading",
        f"{doc}: y.md: no such file",
    ]
    assert anchor("`run_scheduler` in every replica: Procfile") == "run_scheduler-in-every-replica-procfile"
    code = tmp_path / "y.py"
    code.write_text('# see docs/architecture.md, "The rules" and docs/architecture.md, The Lok\n')
    assert [line.split(": ", 1)[1] for line in broken_citations(code)] == [
        "docs/architecture.md, 'The Lok': no such heading"
    ]


# --- settings and check ids --------------------------------------------------------------

SETTING = re.compile(r"[A-Z][A-Z0-9]*(?:_[A-Z0-9]+)+")


@cache
def known_names() -> frozenset[str]:
    """Every ALL_CAPS name the project's code, Makefile and scripts spell, and Django's
    settings (a database's keys too: ``CONN_MAX_AGE``), django-axes' and django-crontab's."""
    import axes.conf
    import django.db.utils
    import django_crontab.app_settings

    sources = [*CODE, ROOT / "Makefile", *(ROOT / "scripts").glob("*"), ROOT / ".ci" / "run"]
    sources += [
        Path(axes.conf.__file__),
        Path(django_crontab.app_settings.__file__),
        Path(django.db.utils.__file__),
    ]
    names = {name for path in sources for name in SETTING.findall(path.read_text())}
    return frozenset(names | {name for name in dir(global_settings) if name.isupper()})


def unknown_settings(text: str) -> set[str]:
    return {span for span in code_spans(text) if SETTING.fullmatch(span)} - known_names()


CHECK_ID = re.compile(r"\b(?:locks|contests|security|ops|axes)\.[EW]\d{3}\b")


@cache
def known_check_ids() -> frozenset[str]:
    import django.core.checks.security

    sources = [path for path in CODE if path.parts[len(ROOT.parts)] in {"locks", "contests"}]
    sources += sorted(Path(django.core.checks.security.__file__).parent.glob("*.py"))
    return frozenset(found for path in sources for found in CHECK_ID.findall(path.read_text()))


@pytest.mark.parametrize("path", DOCS, ids=ids)
def test_every_setting_a_doc_names_exists(path):
    assert unknown_settings(path.read_text()) == set()


def unknown_check_ids(text: str) -> set[str]:
    current, _, upgrading = text.partition("\n## Upgrading\n")
    unknown = set(CHECK_ID.findall(current)) - known_check_ids()
    return unknown | set(CHECK_ID.findall(upgrading)) - known_check_ids() - RETIRED_IDS


@pytest.mark.parametrize("path", DOCS, ids=ids)
def test_every_check_id_a_doc_names_exists(path):
    assert unknown_check_ids(path.read_text()) == set()


def test_the_setting_and_check_id_checks_can_fail():
    assert unknown_settings("`LOCKS_TICK_WINDOW`, `LOCKS_TICK_WINDOWS` and `SECURE_SSL_REDIRECT`") == {
        "LOCKS_TICK_WINDOWS"
    }
    assert "locks.E001" in known_check_ids() and "security.W008" in known_check_ids()
    assert unknown_check_ids("`locks.E001`, `security.W008`, `locks.E099`, `ops.E001`") == {
        "locks.E099",
        "ops.E001",
    }
    assert unknown_check_ids("`locks.E001`\n## Upgrading\n`ops.E001` is `locks.E006`; `ops.E009`") == {
        "ops.E009"
    }


# --- dotted names -----------------------------------------------------------------------

DOTTED = re.compile(r"(?<![\w.])((?:locks|contests|config)(?:\.\w+)+)")
NOT_MODULES = {"locks.api"}  # the lock's logger name (docs/jobs.md, "Settings")
FILE_SUFFIXES = {"com", "yml", "yaml", "json", "md", "py", "css", "txt", "log", "env"}


@cache
def permissions() -> frozenset[str]:
    """``app_label.codename`` of every permission of the project's models."""
    from django.apps import apps

    found = set()
    for model in apps.get_models():
        opts = model._meta
        codenames = [f"{action}_{opts.model_name}" for action in opts.default_permissions]
        found.update(
            f"{opts.app_label}.{codename}" for codename in [*codenames, *(c for c, _ in opts.permissions)]
        )
    return frozenset(found)


def resolves(name: str) -> bool:
    """``name`` is a module, or an attribute of one (at any depth)."""
    parts = name.split(".")
    for split in range(len(parts), 0, -1):
        try:
            found = importlib.import_module(".".join(parts[:split]))
        except ImportError:
            continue
        for part in parts[split:]:
            found = getattr(found, part, None)
        return found is not None
    return False


def unknown_dotted_names(text: str) -> set[str]:
    """``locks.runner.run_locked`` and the like that name no module, or no name in one."""
    names = {
        name for span in code_spans(text.partition("\n## Upgrading\n")[0]) for name in DOTTED.findall(span)
    }
    return {
        name
        for name in names - NOT_MODULES - permissions()
        if not CHECK_ID.fullmatch(name) and name.rsplit(".", 1)[1] not in FILE_SUFFIXES and not resolves(name)
    }


@pytest.mark.parametrize("path", DOCS, ids=ids)
def test_every_module_and_name_a_doc_names_exists(path):
    assert "locks.force_release_synclock" in permissions()
    assert unknown_dotted_names(path.read_text()) == set()


def test_the_dotted_name_check_can_fail():
    assert "locks.force_release_synclock" in permissions()
    assert unknown_dotted_names(
        "`locks.runner.run_locked`, `locks.api.run_locked`, `locks.lease.Nope`, `locks.api`"
    ) == {
        "locks.api.run_locked",
        "locks.lease.Nope",
    }


# --- command options ---------------------------------------------------------------------


@cache
def options_of(command: str) -> frozenset[str] | None:
    app = get_commands().get(command)
    if app is None:
        return None
    parser = load_command_class(app, command).create_parser("manage.py", command)
    found = set()
    parsers = [parser]
    while parsers:
        current = parsers.pop()
        for action in current._actions:  # argparse keeps no public list of a parser's options
            found.update(action.option_strings)
            if isinstance(action.choices, dict):  # subcommands: `locks status`, `locks release`
                parsers.extend(action.choices.values())
    return frozenset(found)


def cited_commands(text: str) -> list[tuple[str, set[str]]]:
    """(command, the options written after it) for each ``manage.py COMMAND …`` and each code
    span that starts with one of this project's commands."""
    cited = []
    for span in code_spans(text):
        for part in re.split(r"&&|;|\|", span.split(" #")[0]):
            words = part.split()
            if "manage.py" in words and words.index("manage.py") + 1 < len(words):
                words = words[words.index("manage.py") + 1 :]
            elif not (words and words[0] in OUR_COMMANDS):
                continue
            cited.append((words[0], set(re.findall(r"(?<![\w-])--[a-z][a-z-]*", " ".join(words[1:])))))
    return cited


def wrong_options(text: str) -> list[str]:
    found = []
    for command, options in cited_commands(text):
        known = options_of(command)
        if known is None:
            found.append(f"no command {command!r}")
        elif options - known:
            found.append(f"{command}: {', '.join(sorted(options - known))}")
    return found


@pytest.mark.parametrize("path", DOCS, ids=ids)
def test_every_command_and_option_a_doc_names_exists(path):
    assert wrong_options(path.read_text()) == []


def test_the_option_check_can_fail():
    assert wrong_options("`python manage.py send_reminders --tick X --tock` and `run_job x --force`") == [
        "send_reminders: --tock"
    ]
    assert wrong_options("```\npython manage.py locks release JOB --token N --reset-tick\n```") == []
    assert wrong_options("`manage.py nosuchcommand`") == ["no command 'nosuchcommand'"]


# --- test names --------------------------------------------------------------------------


@cache
def defined_tests() -> dict[str, set[str]]:
    """Test file path (relative to the checkout) to the names of the test functions in it."""
    return {
        ids(path): {
            node.name
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.FunctionDef) and node.name.startswith("test_")
        }
        for path in sorted((ROOT / "tests").rglob("test_*.py"))
    }


TEST_CITATION = re.compile(
    r"(?<![\w/])((?:[\w/]+/)?test_\w+\.py)(?:::(test_\w+))?|(?<![\w.:/])(test_\w+)\b(?!\.py)"
)


def unknown_tests(text: str) -> list[str]:
    files = defined_tests()
    found = []
    for file, name, bare in TEST_CITATION.findall(text):
        if bare:
            if not any(bare in names for names in files.values()):
                found.append(bare)
            continue
        matching = [path for path in files if path == file or path.endswith(f"/{file}")]
        if not matching:
            found.append(file)
        elif name and not any(name in files[path] for path in matching):
            found.append(f"{file}::{name}")
    return found


@pytest.mark.parametrize("path", DOCS, ids=ids)
def test_every_test_a_doc_names_exists(path):
    assert unknown_tests(path.read_text()) == []


def test_the_test_name_check_can_fail():
    assert unknown_tests(
        "`test_acquire.py::test_release_and_renew_match_on_the_token`, `test_acquire.py::test_nope`, "
        "`tests/locks/test_nothing.py`, `test_the_option_check_can_fail`, `test_never_written`"
    ) == ["test_acquire.py::test_nope", "tests/locks/test_nothing.py", "test_never_written"]


# --- the module map ----------------------------------------------------------------------


def module_map() -> str:
    text = (ROOT / "docs" / "architecture.md").read_text()
    return re.search(r"## Module map\s*```text\n(.*?)```", text, flags=re.S).group(1)


def map_sections(text: str) -> dict[str, list[str]]:
    """Top-level directory in the map to the lines that describe it."""
    sections: dict[str, list[str]] = {}
    current = None
    for line in text.splitlines():
        top = re.match(r"([\w.]+/)", line)
        if top:
            current = top.group(1)
        if current:
            sections.setdefault(current, []).append(line)
    return sections


def test_the_module_map_names_every_module_of_locks_and_only_those():
    lines = map_sections(module_map())["locks/"]
    named = {name for line in lines for name in re.findall(r"\b([a-z_]+)\.py\b", line)}
    on_disk = {path.stem for path in (ROOT / "locks").glob("*.py") if path.stem != "__init__"}
    on_disk |= {path.stem for path in (ROOT / "locks" / "contrib").glob("*/*.py") if path.stem != "__init__"}
    assert named == on_disk
    commands = {path.stem for path in (ROOT / "locks" / "management" / "commands").glob("*.py")} - {
        "__init__"
    }
    [line] = [line for line in lines if "management/commands/" in line]
    assert set(re.findall(r"\b(\w+)\b", line.split("management/commands/")[1])) >= commands


def test_every_file_the_module_map_names_exists():
    missing = []
    for top, lines in map_sections(module_map()).items():
        for name in {
            name for line in lines for name in re.findall(r"(?<![\w/-])([\w/-]+\.(?:py|sh))\b", line)
        }:
            candidates = [ROOT / top / name, ROOT / name, *(ROOT / top).rglob(Path(name).name)]
            if not any(path.exists() for path in candidates):
                missing.append(f"{top}{name}")
    assert missing == []


def test_the_readme_stays_short():
    assert len((ROOT / "README.md").read_text().splitlines()) <= 200


# --- the public API ----------------------------------------------------------------------


def public_api_section() -> str:
    text = (ROOT / "docs" / "jobs.md").read_text()
    return re.search(r"## The public API\n(.*?)\n## ", text, flags=re.S).group(1)


def test_every_public_name_of_locks_is_documented():
    import locks

    documented = set(re.findall(r"`(\w+)`", public_api_section()))
    assert set(locks.__all__) - documented == set()


def doc_imports_from_inside_locks(text: str) -> list[str]:
    """``from locks.X import`` in a Python example: another app uses the package root only."""
    blocks = re.findall(r"```python\n(.*?)```", text, flags=re.S)
    return [
        line.strip()
        for block in blocks
        for line in block.splitlines()
        if re.match(r"\s*from locks\.\w", line)
    ]


@pytest.mark.parametrize("path", DOCS, ids=ids)
def test_every_doc_example_imports_the_lock_from_its_package_root(path):
    assert doc_imports_from_inside_locks(path.read_text()) == []


def test_the_doc_import_check_can_fail():
    assert doc_imports_from_inside_locks("```python\nfrom locks.leases import fenced\n```\n") == [
        "from locks.leases import fenced"
    ]
