"""The soak's record (JSON under var/soak/) and its table, printed and put into docs/faults.md:

    python -m tests.soak.report                       # the table of the last soak (var/soak/last.json)
    python -m tests.soak.report --record FILE         # of another one
    python -m tests.soak.report --write               # and put it into docs/faults.md
    python -m tests.soak.report --replication --write # what holds under each replication mode
    python -m tests.soak.report --mongodb --write     # the last --db mongodb soak's table

The driver saves each soak's record (``save``) and prints the same table at its end. ``save``
also keeps the last record of each replication mode (``MODE_RECORDS``: one server, ``--failover
sync``, ``--failover async``), from which ``--replication`` builds the failover table of
docs/faults.md: what is guaranteed under each mode, and what the last soak of each measured.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from tests.faults.results import ROOT, TABLE_FILE, write_table

RECORDS = ROOT / "var" / "soak"
LAST = RECORDS / "last.json"
# A soak on MongoDB (``--db mongodb``) keeps its own last record and table: it never replaces
# PostgreSQL's.
LAST_MONGODB = RECORDS / "last-mongodb.json"
MONGODB_BEGIN = "<!-- soak-mongodb-table:begin (python -m tests.soak.report --mongodb --write) -->"
MONGODB_END = "<!-- soak-mongodb-table:end -->"
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

# The last record of each replication mode, and the failover table built from them.
MODE_RECORDS = {
    "one-server": "last-one-server.json",
    "sync": "last-failover-sync.json",
    "async": "last-failover-async.json",
}
MODE_TITLES = {
    "one-server": "One server",
    "sync": "Synchronous standby (`synchronous_standby_names = '*'`, `synchronous_commit = on`)",
    "async": "Asynchronous standby",
}
REPLICATION_BEGIN = "<!-- soak-failover-table:begin (python -m tests.soak.report --replication --write) -->"
REPLICATION_END = "<!-- soak-failover-table:end -->"
# What is guaranteed (docs/faults.md, "Failover"; DESIGN rule 16), one row each: one server, sync, async.
GUARANTEES = (
    (
        "An acknowledged tick survives a failover",
        "— (no failover)",
        "yes: the promoted standby shows it done; a second run skips it",
        "no: the ticks of the last moments may vanish with the old primary",
    ),
    (
        "A slot runs at most once",
        "yes",
        "yes; a commit whose sync wait was cancelled is `unknown`, and may run again after a failover (named)",
        "per database history: a slot whose run vanished runs again, never silently: one WARNING per "
        "failover, one more for each further slot at or before its moment, and the ledger names each one "
        '(several can vanish with a frozen link); `on_failover: "pause"` jobs (`send_reminders`) pause '
        "instead, for an operator to resume",
    ),
    (
        "A reminder is emailed once",
        "yes (but for the documented re-sends after a crash, docs/reminders.md)",
        "yes: its delivery is committed on the standby too; a run cut by the failover records it on the new primary",
        "no: a delivery recorded on the old primary only is sent again once the operator resumes "
        "`send_reminders` (the pause names the failover, not the reminders)",
    ),
    (
        "A slot recorded `succeeded` has its writes",
        "yes",
        "yes",
        "yes: a success needs its `committed_token` on the row, else `failed`",
    ),
    (
        "A lease from before the promotion writes on the new primary",
        "—",
        "never (`LockLost`)",
        "never (`LockLost`)",
    ),
    ("Pointed at a standby", "—", 'skipped: "the database is a standby in recovery"', "the same"),
    (
        "A write while the standby is away",
        "—",
        "waits for it without a bound (PostgreSQL's); a first INSERT's contender gives up in 5 s",
        "does not wait",
    ),
)
# What the last soak of each mode measured: (record key in its ``replication`` row, row title).
MEASURED = (
    ("failovers", "Failovers"),
    ("slots", "Slots"),
    ("repeats", "Slots run twice (two acknowledged fenced writes)"),
    ("detected", "… detected (the failover's WARNING and the ledger name it)"),
    ("silent", "… silent"),
    ("acknowledged_lost", "Acknowledged fenced writes lost"),
    ("emails_twice", "Emails sent twice across a failover (the SMTP stand-in's count)"),
    ("emails_silent", "… with no failover pause naming it first"),
    ("succeeded_without_write", "Succeeded without its write"),
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
    if record.get("db") == "mongodb":
        (directory / LAST_MONGODB.name).write_text(text)
        return path
    (directory / LAST.name).write_text(text)
    (directory / MODE_RECORDS[record.get("failover") or "one-server"]).write_text(text)
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


def replication_table(records: dict[str, dict | None]) -> str:
    """One table: the guarantees under each mode, then what its last soak measured
    (``records``: a mode's last record, or None when there is none yet)."""
    modes = list(MODE_RECORDS)
    lines = [
        "| | " + " | ".join(MODE_TITLES[mode] for mode in modes) + " |",
        "|---|" + "---|" * len(modes),
        *("| " + " | ".join(row) + " |" for row in GUARANTEES),
    ]

    def soak(record: dict | None) -> str:
        if record is None:
            return "no record yet"
        verdict = "PASS" if record["passed"] else "FAIL"
        return (
            f"**{verdict}**, seed {record['seed']}, {record['duration']:g} s, "
            f"{', '.join(record['nemesis']) or 'no nemesis'}; code {record['code']}, {record['started_at']}"
        )

    lines.append("| Measured by the soak | " + " | ".join(soak(records[mode]) for mode in modes) + " |")
    for key, title in MEASURED:
        cells = []
        for mode in modes:
            row = (records[mode] or {}).get("replication") or {}
            value = row.get(key)
            cells.append("-" if value is None else str(value))
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def load_modes(directory: Path = RECORDS) -> dict[str, dict | None]:
    return {
        mode: json.loads(path.read_text()) if (path := directory / name).exists() else None
        for mode, name in MODE_RECORDS.items()
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render the last soak's table.")
    parser.add_argument(
        "--record", type=Path, help="A soak's JSON record (default: the last one, or the last on MongoDB)."
    )
    parser.add_argument("--mongodb", action="store_true", help="The last --db mongodb soak's table.")
    parser.add_argument("--write", action="store_true", help="Put it into docs/faults.md.")
    parser.add_argument(
        "--replication",
        action="store_true",
        help="The failover table instead: guarantees and the last soak of each replication mode.",
    )
    args = parser.parse_args(argv)
    args.record = args.record or (LAST_MONGODB if args.mongodb else LAST)
    if args.replication:
        rendered = replication_table(load_modes(args.record.parent))
        sys.stdout.write(rendered + "\n")
        if args.write:
            write_table(rendered, TABLE_FILE, begin=REPLICATION_BEGIN, end=REPLICATION_END)
        return 0
    if not args.record.exists():
        run = "make soak-mongodb" if args.mongodb else "make soak"
        sys.stderr.write(f"soak report: no record at {args.record}: run `{run}` first\n")
        return 2
    rendered = render(json.loads(args.record.read_text()))
    sys.stdout.write(rendered + "\n")
    if args.write:
        begin, end = (MONGODB_BEGIN, MONGODB_END) if args.mongodb else (BEGIN, END)
        write_table(rendered, TABLE_FILE, begin=begin, end=end)
    return 0


if __name__ == "__main__":
    sys.exit(main())
