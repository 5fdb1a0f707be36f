"""The soak's record rendered as the table in docs/faults.md."""

from __future__ import annotations

import json

from tests.faults import results
from tests.soak import report


def record(**changes) -> dict:
    row = {"slots": 3, "duplicates": 0, "lost": 0, "excused": 0, "stale": 0}
    row |= {"success_mismatch": 0, "running": 0, "waits": 0, "late": 0}
    return {
        "stamp": "20261202T100000Z",
        "seed": 1651,
        "duration": 70,
        "replicas": 3,
        "nemesis": ["kill", "pause"],
        "catch_up_text": "catch_up not set (the default, latest)",
        "healthy_slots": 3,
        "period": 10,
        "ttl": 4,
        "code": "5498752",
        "started_at": "2026-12-02 10:00 UTC",
        "window": ["…"] * 10,
        "reproduce": "scripts/with-postgres.sh .venv/bin/python -m tests.soak --seed 1651",
        "actions": [{"kind": "kill"}, {"kind": "pause"}],
        "table": [
            {"kind": "kill", "actions": 1, **row},
            {"kind": "pause", "actions": 1, **row, "lost": 2, "excused": 1, "stale": 1},
            {"kind": "none (healthy)", "actions": 0, **row},
            {"kind": "all", "actions": 2, **row, "slots": 9, "lost": 2, "excused": 1, "stale": 1},
        ],
        "checks": [
            {"name": "one-write-per-slot", "title": "no slot has two rows", "passed": True, "detail": "none"},
            {
                "name": "no-lost-slot",
                "title": "every slot has its row",
                "passed": False,
                "detail": "2 slots lost",
            },
        ],
        "passed": False,
        **changes,
    }


def test_the_table_has_a_row_per_kind_and_every_check_below_it():
    lines = report.render(record()).splitlines()

    assert lines[0].startswith(
        "**FAIL**, seed 1651: 70 s of nemesis (kill, pause; 2 actions), 3 replicas, then 3 healthy slots; "
        "catch_up not set (the default, latest); 10 slots in the window, one every 10 s, lease TTL 4 s; code 5498752"
    )
    assert lines[1] == "Reproduce: `scripts/with-postgres.sh .venv/bin/python -m tests.soak --seed 1651`"
    assert lines[3].startswith("| Nemesis | Actions | Slots | Duplicates | Lost | Stale writes |")
    assert lines[5:9] == [
        "| kill | 1 | 3 | 0 | 0 | 0 | 0 | 0 | 0 | 0 |",
        "| pause | 1 | 3 | 0 | 2 (+1 excused) | 1 | 0 | 0 | 0 | 0 |",
        "| none (healthy) | 0 | 3 | 0 | 0 | 0 | 0 | 0 | 0 | 0 |",
        "| **all** | 2 | 9 | 0 | 2 (+1 excused) | 1 | 0 | 0 | 0 | 0 |",
    ]
    assert lines[10:] == [
        "- ✅ `one-write-per-slot` (no slot has two rows): none",
        "- ❌ `no-lost-slot` (every slot has its row): 2 slots lost",
    ]
    assert report.render(record(passed=True)).startswith("**PASS**, seed 1651")


def test_a_soak_with_reminders_has_their_table_between_the_slots_and_the_checks():
    numbers = {"seeded": 73, "judged": 73, "delivered": 70, "uncertain": 2, "failed": 0, "waiting": 1}
    numbers |= {"lost": 0, "copies": 80, "lost_replies": 2, "run_kills": 1, "resent": 7, "charged": 7}
    numbers["allowed"] = 50

    lines = report.render(record(reminders=numbers)).splitlines()

    assert lines[9] == ""
    assert lines[10].startswith(
        "| Reminders | Due by the last slot | Delivered | Uncertain | Failed | Waiting"
    )
    assert "| Kills of reminder runs | Re-sent | Re-sent after a kill of its run |" in lines[10]
    assert lines[12] == "| 73 | 73 | 70 | 2 | 0 | 1 | 0 | 80 | 2 | 1 | 7 | 7 | 50 |"
    assert lines[14].startswith("- ✅ `one-write-per-slot`")
    assert "| Reminders |" not in report.render(record(reminders=None))


def test_save_keeps_each_record_and_the_last_one(tmp_path):
    path = report.save(record(), directory=tmp_path)

    assert path.name == "soak-20261202T100000Z-seed1651.json"
    assert json.loads(path.read_text()) == json.loads((tmp_path / "last.json").read_text()) == record()


def test_write_replaces_the_soak_table_and_leaves_the_fault_table(tmp_path):
    doc = tmp_path / "faults.md"
    doc.write_text(
        f"# Faults\n{results.BEGIN}\nfault table\n{results.END}\n## The soak\n{report.BEGIN}\nold\n{report.END}\nend\n"
    )

    results.write_table("new soak table", doc, begin=report.BEGIN, end=report.END)

    assert doc.read_text() == (
        f"# Faults\n{results.BEGIN}\nfault table\n{results.END}\n## The soak\n{report.BEGIN}\n"
        f"new soak table\n{report.END}\nend\n"
    )


def test_docs_faults_md_has_the_soak_table_markers_once():
    text = results.TABLE_FILE.read_text()

    assert text.count(report.BEGIN) == text.count(report.END) == 1
    assert text.index(results.END) < text.index(report.BEGIN) < text.index(report.END)


def test_save_keeps_the_last_record_of_each_replication_mode(tmp_path):
    report.save(record(), directory=tmp_path)
    report.save(record(stamp="20261202T110000Z", failover="async"), directory=tmp_path)

    assert json.loads((tmp_path / "last-one-server.json").read_text())["stamp"] == "20261202T100000Z"
    assert json.loads((tmp_path / "last-failover-async.json").read_text())["failover"] == "async"
    assert not (tmp_path / "last-failover-sync.json").exists()
    assert report.load_modes(tmp_path)["sync"] is None


def test_the_failover_table_has_the_guarantees_then_what_each_modes_last_soak_measured():
    measured = {"failovers": 6, "slots": 64, "repeats": 2, "detected": 1, "silent": 1, "acknowledged_lost": 3}
    measured |= {"emails_twice": 30, "emails_silent": 0, "succeeded_without_write": 0}
    text = report.replication_table(
        {
            "one-server": record(passed=True),
            "sync": None,
            "async": record(failover="async", replication=measured),
        }
    )
    lines = text.splitlines()

    assert lines[0].startswith("| | One server | Synchronous standby")
    assert len(lines) == 2 + len(report.GUARANTEES) + 1 + len(report.MEASURED)
    assert lines[2 + len(report.GUARANTEES)].startswith(
        "| Measured by the soak | **PASS**, seed 1651, 70 s, kill, pause; code 5498752, 2026-12-02 10:00 UTC | "
        "no record yet | **FAIL**, seed 1651"
    )
    assert "| Slots run twice (two acknowledged fenced writes) | - | - | 2 |" in lines
    assert "| … silent | - | - | 1 |" in lines


def test_docs_faults_md_has_the_failover_table_markers_once():
    text = results.TABLE_FILE.read_text()

    assert text.count(report.REPLICATION_BEGIN) == text.count(report.REPLICATION_END) == 1


def test_a_soak_on_mongodb_keeps_its_own_last_record_and_never_replaces_postgresqls(tmp_path):
    report.save(record(), directory=tmp_path)
    report.save(record(stamp="20261202T110000Z", db="mongodb"), directory=tmp_path)

    assert json.loads((tmp_path / "last.json").read_text())["stamp"] == "20261202T100000Z"
    assert json.loads((tmp_path / "last-one-server.json").read_text())["stamp"] == "20261202T100000Z"
    assert json.loads((tmp_path / "last-mongodb.json").read_text())["db"] == "mongodb"


def test_docs_faults_md_has_the_mongodb_soak_table_markers_once_after_the_soak_table():
    text = results.TABLE_FILE.read_text()

    assert text.count(report.MONGODB_BEGIN) == text.count(report.MONGODB_END) == 1
    assert text.index(report.END) < text.index(report.MONGODB_BEGIN) < text.index(report.MONGODB_END)
