"""The fault scenarios, what each must show, and the table of what the runs saw (docs/faults.md).

Each fault test carries ``@pytest.mark.scenario(KEY)`` and reports what it
observed (counts, exit codes, log lines) through the ``observe`` fixture; the
test session stores that per backend under ``var/faults/``. This module renders
those records as the results table in docs/faults.md:

    python -m tests.faults.results            # print the table
    python -m tests.faults.results --write    # and put it into docs/faults.md
"""

from __future__ import annotations

import argparse
import json
import sys
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
RESULTS_DIR = ROOT / "var" / "faults"
TABLE_FILE = ROOT / "docs" / "faults.md"
BEGIN = "<!-- faults-table:begin (python -m tests.faults.results --write) -->"
END = "<!-- faults-table:end -->"
BACKENDS = {"sqlite": "SQLite", "postgresql": "PostgreSQL"}


@dataclass(frozen=True)
class Scenario:
    key: str
    title: str
    expected: str


SCENARIOS = [
    Scenario(
        "clock-skew-16",
        "16 processes whose clocks are 7 min fast, 7 min slow or right (faketime) run at a slot",
        "fast and right name that slot, slow ones (beyond the 5 min tick window) the slot before; "
        "at most 1 sync per tick, at least 1 in all; each skewed process warns about its clock, "
        "no right one does",
    ),
    Scenario(
        "clock-skew-40",
        "a host whose clock is 40 min slow runs the job",
        "WARNING that host and database clocks disagree by more than 120 s; exit 0",
    ),
    Scenario(
        "three-hosts",
        "3 hosts (network namespaces, veth links) run `sync_contests` for 2 ticks",
        "1 sync per tick across the 3 hosts, the others skip",
    ),
    Scenario(
        "partition",
        "the holder's link is cut in the middle of a slow sync",
        "after the lease expires another host syncs the next tick, while the old holder is still cut off; "
        "the old holder's heartbeat fails, it aborts without writing and records or logs `lost_lock`, "
        "no traceback",
    ),
    Scenario(
        "sigkill-mid-write",
        "SIGKILL of the holder in the middle of its write transaction",
        "no partial rows; the lease expires after its TTL; the next tick syncs every contest",
    ),
    Scenario(
        "db-stop-during-sync",
        "PostgreSQL stopped while a sync runs",
        "no traceback; its heartbeat finds the database gone and the run ends `lost_lock` (WARNING lines, "
        "one ERROR line), writes nothing, exit 1; after a restart the next tick syncs",
    ),
    Scenario(
        "db-stop-during-acquire",
        "a copy meets the lock row locked by a holder's write, then PostgreSQL is stopped and a copy tries "
        "to acquire",
        "the first copy never waits on the row: it skips at once (`held`, the row locked by a write in "
        "progress), exit 0; the second: no traceback, one WARNING naming the job and the cause, exit 0; "
        "after a restart the next tick syncs",
    ),
    Scenario(
        "db-silent",
        "a PostgreSQL address that accepts TCP and never answers",
        "gives up after its connect timeout (5 s): one WARNING, exit 0, no traceback",
    ),
    Scenario(
        "long-job",
        "a sync slowed to 4x the lease TTL by a slow stand-in; copies for the same tick start one after "
        "another throughout",
        "the heartbeat keeps the lease: every copy skips, with `held` while the job runs "
        "(also after 2x TTL); one run, token 1",
    ),
    Scenario(
        "stalled-answer",
        "a stalled answer: the stand-in sends the headers, then one body byte every 0.2 s, so the "
        "30 s read timeout never fires (total deadline `CODEFORCES_TOTAL_TIMEOUT` set to 2 s)",
        "ends at the deadline: exit 1, one ERROR line naming `CODEFORCES_TOTAL_TIMEOUT`, no traceback, "
        "nothing written, the lease released; the next tick syncs",
    ),
    Scenario(
        "poison-entry",
        "a poison entry: the real list plus entries no database can store (ids 2**31 and 2**63, a "
        "duration of 10**20 s, a start time out of range, NUL in a name or type, an unpaired surrogate)",
        "counted invalid, the rest synced: exit 0, every real contest stored, one WARNING naming the "
        "skipped entries, no traceback; the next tick the same",
    ),
    Scenario(
        "between-slots",
        "a run at 07:37 (a manual or late run), then the scheduled 08:00 run (faketime, yesterday)",
        "the 07:37 run claims 07:00 (08:00 is beyond the 5 min tick window) and syncs; the 08:00 run claims "
        "08:00 and syncs too: exit 0 twice, 2 JobRuns, 2 API calls",
    ),
    Scenario(
        "host-a-day-fast",
        "a host whose clock is a day fast (faketime +1d) runs the job, before and after a host with the "
        "right clock",
        "PostgreSQL only (on SQLite the database clock is each process's own): the fast host is refused, "
        "exit 0, one WARNING naming its offset (+86400 s), nothing stored; the right host syncs the current "
        "tick",
    ),
    Scenario(
        "codeforces-down-at-slot",
        "Codeforces answers HTTP 503 to every attempt of the 07:00 run, then recovers; runs at 07:20 and "
        "07:40 follow (faketime, yesterday)",
        "07:00 fails: exit 1, one ERROR line, nothing written; 07:20 claims the 07:00 tick again and syncs; "
        "07:40 skips it as already done; 2 JobRuns for that tick, failed then succeeded",
    ),
    Scenario(
        "prune-host-fast",
        "a host whose clock is 100 s fast (faketime) syncs while a reminder's contest starts in 90 s by the "
        "database clock",
        'PostgreSQL only (on SQLite the database clock is each process\'s own): the prune judges "started" '
        "by the database clock, so the reminder is kept (exit 0); a sync after the start prunes it",
    ),
    Scenario(
        "commit-answer-lost",
        "the server commits a run's fenced write, and a proxy drops the COMMIT's answer with the connection",
        "PostgreSQL only: the run reads the lock row back on a new connection, finds its write committed and "
        "succeeds (exit 0, one WARNING, no traceback); the tick is done; a second run of that tick skips it",
    ),
    Scenario(
        "commit-lost",
        "a proxy drops a run's COMMIT with the connection before it reaches the server",
        "PostgreSQL only: the server rolls the write back; the run reads the lock row back, finds it did not "
        "commit and fails (exit 1, no traceback); the tick stays open and the next run of it succeeds",
    ),
    Scenario(
        "commit-unknown",
        "the server commits a run's fenced write, a proxy drops the COMMIT's answer, and every read-back "
        "of the lock row is cut too",
        "PostgreSQL only: the run is unknown, never failed (exit 1, no traceback); the tick is done, so the "
        "next run of it skips; the next lease resolves the run as succeeded from the row",
    ),
    Scenario(
        "failover-write-lost",
        "async standby, link frozen: a run's fenced write commits on the old primary only, the primary dies, "
        "the standby is promoted, and the run's release lands on it",
        "PostgreSQL only: recorded `failed` (its fenced write is not in this database's history), never "
        "`succeeded`; the tick stays open; the next run warns once of the failover and its JobRun is marked",
    ),
    Scenario(
        "failover-async-repeat",
        "async standby, link frozen: two ticks run to their end on the primary, which dies; the standby is promoted",
        "PostgreSQL only: both ticks run again on the new primary (asynchronous replication allows it), never "
        "silently: one WARNING naming the failover, one more for each further slot at or before it, each run "
        "marked in the ledger; a job with `on_failover: pause` is paused instead",
    ),
    Scenario(
        "failover-standby",
        "a copy pointed at a standby in recovery; a multi-host URL naming the standby, then the primary",
        "PostgreSQL only: skipped, reason `the database is a standby in recovery`, exit 0 (also with "
        "`target_session_attrs=any`); `locks status` says so; the multi-host URL finds the primary and runs",
    ),
    Scenario(
        "failover-sync",
        "synchronous standby: a tick succeeds, the primary dies, the standby is promoted",
        "PostgreSQL only: the tick is done on the new primary: a second run skips it; 0 repeats",
    ),
    Scenario(
        "failover-sync-cancelled",
        "synchronous standby away: the fenced COMMIT waits for it and that wait is cancelled "
        "(committed locally only); then a failover",
        "PostgreSQL only: the run is `unknown`, not `succeeded`; after the failover the tick runs again and "
        "the lost run is recorded abandoned, lost in a failover",
    ),
    Scenario(
        "failover-sync-first-insert",
        "synchronous standby away: two copies insert a new job's lock row",
        "PostgreSQL only: the second gives up on the row within its lock_timeout (skipped `held`), "
        "never waits without a bound; the first runs once the standby is back",
    ),
]
BY_KEY = {scenario.key: scenario for scenario in SCENARIOS}


def record(*, backend: str, key: str, outcome: str, observed: str, results_dir: Path = RESULTS_DIR) -> None:
    """Store what one scenario did on one backend (merged with earlier records)."""
    if key not in BY_KEY:
        raise KeyError(f"unknown fault scenario {key!r}; add it to tests/faults/results.py SCENARIOS")
    results_dir.mkdir(parents=True, exist_ok=True)
    path = results_dir / f"{backend}.json"
    data = json.loads(path.read_text()) if path.exists() else {}
    data[key] = {"outcome": outcome, "observed": observed}
    path.write_text(json.dumps(data, indent=1, sort_keys=True, ensure_ascii=False) + "\n")


def load(results_dir: Path = RESULTS_DIR) -> dict[str, dict]:
    loaded = {}
    for backend in BACKENDS:
        path = results_dir / f"{backend}.json"
        loaded[backend] = json.loads(path.read_text()) if path.exists() else {}
    return loaded


def _cell(entry: dict | None) -> str:
    if entry is None:
        return "not run"
    text = entry["observed"] or ""
    if entry["outcome"] == "passed":
        cell = f"✅ {text}"
    elif entry["outcome"] == "skipped":
        cell = f"skipped: {text}"
    else:
        cell = f"❌ FAILED: {text}"
    return cell.replace("|", "\\|").replace("\n", " ")


def table(results: dict[str, dict]) -> str:
    lines = [
        "| Scenario | Expected | Observed on SQLite | Observed on PostgreSQL |",
        "|---|---|---|---|",
    ]
    for scenario in SCENARIOS:
        cells = [scenario.title, scenario.expected]
        cells += [_cell(results[backend].get(scenario.key)) for backend in BACKENDS]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines)


def table_rows(text: str) -> list[tuple[str, str]]:
    """(scenario, expected) of each row of the results table in ``text``."""
    try:
        section = text.split(BEGIN, 1)[1].split(END, 1)[0]
    except IndexError:
        return []
    rows = []
    for line in section.strip().splitlines()[2:]:
        cells = [cell.strip() for cell in line.strip().strip("|").split(" | ")]
        rows.append((cells[0], cells[1]))
    return rows


def write_table(rendered: str, path: Path = TABLE_FILE, *, begin: str = BEGIN, end: str = END) -> None:
    """Replace what lies between the markers ``begin`` and ``end`` in ``path`` (the soak's
    table, tests/soak/report.py, has markers of its own)."""
    text = path.read_text()
    if begin not in text or end not in text:
        raise SystemExit(f"{path}: the markers {begin!r} … {end!r} are missing")
    head, rest = text.split(begin, 1)
    tail = rest.split(end, 1)[1]
    path.write_text(f"{head}{begin}\n{rendered}\n{end}{tail}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Render the fault-test results table.")
    parser.add_argument("--write", action="store_true", help="Replace the table in docs/faults.md.")
    args = parser.parse_args(argv)
    rendered = table(load())
    sys.stdout.write(rendered + "\n")
    if args.write:
        write_table(rendered)
    return 0


if __name__ == "__main__":
    sys.exit(main())
