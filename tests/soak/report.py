"""The soak's record (JSON under var/soak/) and its table, printed and put into docs/faults.md:

    python -m tests.soak.report                       # the table of the last soak (var/soak/last.json)
    python -m tests.soak.report --record FILE         # of another one
    python -m tests.soak.report --write               # and put it into docs/faults.md

The driver saves each soak's record (``save``) and prints the same table at its end.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tests.faults.results import ROOT, TABLE_FILE, write_table

RECORDS = ROOT / "var" / "soak"
LAST = RECORDS / "last.json"
BEGIN = "<!-- soak-table:begin (python -m tests.soak.report --write) -->"
END = "<!-- soak-table:end -->"
COLUMNS = (
    ("kind", "Nemesis"),
    ("actions", "Actions"),
    ("slots", "Slots"),
    ("duplicates", "Duplicates"),
    ("lost", "Lost"),
    ("stale", "Stale writes"),
    ("success_mismatch", "Not one success"),
    ("running", "Left running"),
    ("waits", "Waits > TTL"),
    ("late", "Late (> 1 period)"),
)

# The reminders part (--reminders): one row, the reminders' fates and the stand-in's copies.
REMINDER_COLUMNS = (
    ("seeded", "Reminders"),
    ("judged", "Due by the last slot"),
    ("delivered", "Delivered"),
    ("uncertain", "Uncertain"),
    ("failed", "Failed"),
    ("waiting", "Waiting (killed run's claim)"),
    ("lost", "Lost"),
    ("copies", "Messages at the stand-in"),
    ("lost_replies", "Lost replies"),
    ("run_kills", "Kills of reminder runs"),
    ("resent", "Re-sent"),
    ("charged", "Re-sent after a kill of its run"),
    ("allowed", "Re-sends allowed (RECORD_EVERY per kill of a reminder run)"),
)


def save(record: dict, *, directory: Path = RECORDS) -> Path:
    """The record as ``soak-<stamp>-seed<seed>.json`` and as ``last.json``; the first's path."""
    directory.mkdir(parents=True, exist_ok=True)
    text = json.dumps(record, indent=1, ensure_ascii=False) + "\n"
    path = directory / f"soak-{record['stamp']}-seed{record['seed']}.json"
    path.write_text(text)
    (directory / LAST.name).write_text(text)
    return path


def _cell(row: dict, key: str) -> str:
    value = row[key]
    if key == "lost" and row["excused"]:
        return f"{value} (+{row['excused']} excused)"
    return str(value)


def table(record: dict) -> str:
    lines = [
        "| " + " | ".join(title for _key, title in COLUMNS) + " |",
        "|" + "---|" * len(COLUMNS),
    ]
    for row in record["table"]:
        kind = f"**{row['kind']}**" if row["kind"] == "all" else row["kind"]
        lines.append("| " + " | ".join([kind, *(_cell(row, key) for key, _title in COLUMNS[1:])]) + " |")
    return "\n".join(lines)


def reminder_table(numbers: dict) -> str:
    return "\n".join(
        [
            "| " + " | ".join(title for _key, title in REMINDER_COLUMNS) + " |",
            "|" + "---|" * len(REMINDER_COLUMNS),
            # A record from before a column existed shows a dash there.
            "| " + " | ".join(str(numbers.get(key, "-")) for key, _title in REMINDER_COLUMNS) + " |",
        ]
    )


def render(record: dict) -> str:
    """A heading line (verdict, seed, what ran), the table, then every check."""
    verdict = "PASS" if record["passed"] else "FAIL"
    kinds = ", ".join(record["nemesis"]) or "none"
    head = (
        f"**{verdict}**, seed {record['seed']}: {record['duration']:g} s of nemesis ({kinds}; "
        f"{len(record['actions'])} actions), {record['replicas']} replicas, then {record['healthy_slots']} "
        f"healthy slots; {record['catch_up_text']}; {len(record['window'])} slots in the window, one every "
        f"{record['period']} s, lease TTL {record['ttl']} s; code {record['code']}, {record['started_at']}.  \n"
        f"Reproduce: `{record['reproduce']}`"
    )
    checks = [
        f"- {'✅' if check['passed'] else '❌'} `{check['name']}` ({check['title']}): {check['detail']}"
        for check in record["checks"]
    ]
    mail = ["", reminder_table(record["reminders"])] if record.get("reminders") else []
    return "\n".join([head, "", table(record), *mail, "", *checks])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render the last soak's table.")
    parser.add_argument(
        "--record", type=Path, default=LAST, help="A soak's JSON record (default: the last one)."
    )
    parser.add_argument("--write", action="store_true", help="Put it into docs/faults.md.")
    args = parser.parse_args(argv)
    if not args.record.exists():
        sys.stderr.write(f"soak report: no record at {args.record}: run `make soak` first\n")
        return 2
    rendered = render(json.loads(args.record.read_text()))
    sys.stdout.write(rendered + "\n")
    if args.write:
        write_table(rendered, TABLE_FILE, begin=BEGIN, end=END)
    return 0


if __name__ == "__main__":
    sys.exit(main())
