"""The results table in docs/faults.md stays in step with the scenarios the fault tests run."""

from __future__ import annotations

import re
from pathlib import Path

from tests.faults import results

HERE = Path(__file__).resolve().parent


def test_the_table_lists_every_scenario_with_its_expectation():
    rows = results.table_rows(results.TABLE_FILE.read_text())

    assert rows == [(scenario.title, scenario.expected) for scenario in results.SCENARIOS]


def test_every_scenario_has_exactly_one_test():
    marked = [
        key
        for path in sorted(HERE.glob("test_*.py"))
        for key in re.findall(r"@pytest\.mark\.scenario\(\"([\w-]+)\"\)", path.read_text())
    ]

    assert sorted(marked) == sorted(results.BY_KEY)


def test_table_shows_each_backend_and_outcome(tmp_path):
    results.record(
        backend="postgresql",
        key="db-silent",
        outcome="passed",
        observed="gave up after 5 s",
        results_dir=tmp_path,
    )
    results.record(
        backend="sqlite", key="db-silent", outcome="failed", observed="exit 1", results_dir=tmp_path
    )
    results.record(
        backend="sqlite", key="partition", outcome="skipped", observed="PostgreSQL only", results_dir=tmp_path
    )

    rendered = results.table(results.load(tmp_path)).splitlines()

    assert rendered[0] == "| Scenario | Expected | Observed on SQLite | Observed on PostgreSQL |"
    assert len(rendered) == 2 + len(results.SCENARIOS)
    silent = next(line for line in rendered if line.startswith("| a PostgreSQL address that accepts TCP"))
    assert silent.endswith("| ❌ FAILED: exit 1 | ✅ gave up after 5 s |")
    partition = next(line for line in rendered if line.startswith("| the holder's link is cut"))
    assert partition.endswith("| skipped: PostgreSQL only | not run |")


def test_write_table_replaces_only_the_table(tmp_path):
    doc = tmp_path / "faults.md"
    doc.write_text(f"# Title\n\nbefore\n{results.BEGIN}\nold table\n{results.END}\nafter\n")

    results.write_table("| new |", doc)

    assert doc.read_text() == f"# Title\n\nbefore\n{results.BEGIN}\n| new |\n{results.END}\nafter\n"
