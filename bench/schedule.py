"""Bench part ``schedule``: real ``run_scheduler`` replicas on PostgreSQL, N no-op jobs at
``* * * * *``, R replicas, M whole minutes; issue 36's table (docs/benchmarks.md, "The scheduler").

The window is M minutes of wall time that starts 2 s before a minute boundary, once every replica
has asked for each job once (its start-up burst is outside it). Per window:

- CPU: each replica's utime + stime + cutime + cstime from /proc/<pid>/stat (the children it
  waited for are in cutime/cstime), plus its live descendants' (a pool's workers);
- forks: each run logs one line ``job=… tick=… holder=HOST:PID:… outcome=…`` (locks.api, INFO) in
  the process that ran it (a forked child, or a pool's worker): the PIDs of those lines with a time
  inside the window that no line before the window had, across replicas;
- connections: the delta of ``pg_stat_database.sessions`` for the database (PostgreSQL 14+);
- statements: ``sum(calls)`` of ``pg_stat_statements`` for the database (reset at the window's
  start; the bench's own reads left out), BEGIN/COMMIT/SAVEPOINT/RELEASE included;
- once: ``JobRun`` rows per (job, slot) for the window's M slots: each must be exactly one,
  succeeded.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta

from bench.backends import ROOT, Backend

# libpq's statements of the bench itself (the snapshots) are left out of the count.
OWN = "query NOT ILIKE '%pg_stat%' AND query NOT ILIKE '%pg_database%'"
ASK_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ \w+ locks\.\S+ job=(\S+) tick=\S+ holder=[^:\s]*:(\d+):"
)
# A replica that lost a tick's claim (locks.scheduler) runs nothing, and says so in this line.
LOST_LINE = re.compile(
    r"^(\d{4}-\d\d-\d\d \d\d:\d\d:\d\d),\d+ \w+ locks\.scheduler scheduler: job=\S+ .*claimed by another copy"
)
CONTROL = ("BEGIN", "COMMIT", "ROLLBACK", "SAVEPOINT", "RELEASE")


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def parse_sizes(text: str) -> list[tuple[int, int]]:
    """``10x1,100x3`` → [(10, 1), (100, 3)]: jobs by replicas."""
    sizes = []
    for item in text.split(","):
        jobs, _x, replicas = item.strip().partition("x")
        sizes.append((int(jobs), int(replicas)))
    return sizes


def schedule(backend: Backend, *, sizes: list[tuple[int, int]], minutes: int) -> dict:
    if backend.name != "postgresql":
        return {}
    with backend.raw() as db:
        try:
            db.execute("CREATE EXTENSION IF NOT EXISTS pg_stat_statements")
            db.execute("SELECT pg_stat_statements_reset()")
            statements = True
        except Exception as exc:  # not in shared_preload_libraries: no statement counts
            log(f"pg_stat_statements unavailable ({exc}); statements are not counted")
            statements = False
    results: dict = {}
    for jobs, replicas in sizes:
        backend.reset()
        log(f"{backend.name}: run_scheduler, {jobs} no-op jobs x {replicas} replicas, {minutes} min")
        row = _measure(backend, jobs=jobs, replicas=replicas, minutes=minutes, statements=statements)
        log(
            f"  CPU-s/replica/min {row['cpu_per_replica_minute']:.2f}  forks/min {row['forks_per_minute']:.1f}"
            f"  connections/min {row['connections_per_minute']:.1f}"
            f"  statements/slot {row.get('statements_per_slot', float('nan')):.1f}"
            f"  once {row['once']}/{row['slots']} (twice {row['twice']}, missed {row['missed']})"
        )
        results[f"{jobs}x{replicas}"] = row
    return results


def _measure(backend: Backend, *, jobs: int, replicas: int, minutes: int, statements: bool) -> dict:
    with contextlib.ExitStack() as stack:
        logs = [stack.enter_context(tempfile.TemporaryFile()) for _ in range(replicas)]
        return _measure_with(backend, logs, jobs=jobs, minutes=minutes, statements=statements)


def _measure_with(backend: Backend, logs: list, *, jobs: int, minutes: int, statements: bool) -> dict:
    replicas = len(logs)
    env = backend.env(
        DJANGO_SETTINGS_MODULE="bench.schedule_settings",
        BENCH_SCHED_JOBS=str(jobs),
        LOCKS_LOG_LEVEL="INFO",
        TZ="UTC",  # the log lines' times, compared with the window's
    )
    processes = [
        subprocess.Popen(
            [sys.executable, str(ROOT / "manage.py"), "run_scheduler"],
            cwd=ROOT,
            env=env,
            stdout=subprocess.DEVNULL,
            stderr=out,
        )
        for out in logs
    ]
    try:
        _wait_for_start(processes, logs, jobs=jobs)
        first = _next_minute(datetime.now(UTC) + timedelta(seconds=5))
        start, end = first - timedelta(seconds=2), first + timedelta(minutes=minutes, seconds=-2)
        _sleep_until(start)
        with backend.raw() as db:
            cpu_before = [_cpu(process.pid) for process in processes]
            sessions_before = _sessions(db)
            if statements:
                db.execute("SELECT pg_stat_statements_reset()")
            _sleep_until(end)
            cpu = [_cpu(process.pid) - before for process, before in zip(processes, cpu_before, strict=True)]
            time.sleep(1.5)  # a backend's ended session reaches pg_stat_database within a second
            sessions = _sessions(db) - sessions_before
            counted = _statements(db) if statements else None
            once = _once(db, first=first, minutes=minutes)
    finally:
        for process in processes:
            process.send_signal(signal.SIGTERM)
        for process in processes:
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
    forks = sum(len(_pids(out, start=start, end=end) - _pids(out, end=start)) for out in logs)
    slots = jobs * minutes
    row = {
        "jobs": jobs,
        "replicas": replicas,
        "minutes": minutes,
        "window": [start.isoformat(), end.isoformat()],
        "cpu": [round(seconds, 2) for seconds in cpu],
        "cpu_per_replica_minute": sum(cpu) / replicas / minutes,
        "forks_per_minute": forks / minutes,
        "connections_per_minute": sessions / minutes,
        "slots": slots,
        **once,
        "missed": slots - once["seen"],
    }
    if counted is not None:
        row["statements"], row["control_statements"] = counted
        row["statements_per_slot"] = counted[0] / slots
    return row


def _wait_for_start(processes, logs, *, jobs: int, limit: float = 300) -> None:
    """Until every replica has asked once for each job (its start-up burst is over)."""
    deadline = time.monotonic() + limit
    while time.monotonic() < deadline:
        for process in processes:
            if process.poll() is not None:
                raise RuntimeError(f"run_scheduler exited {process.returncode}: {_text(logs[0])[-3000:]}")
        if all(_asks(out) >= jobs for out in logs):  # asked, and won or lost
            return
        time.sleep(0.5)
    raise RuntimeError("run_scheduler replicas did not ask for every job within 300 s")


def _text(out) -> str:
    out.seek(0)
    return out.read().decode(errors="replace")


def _asks(out, *, start: datetime | None = None, end: datetime | None = None) -> int:
    """The ticks a replica ran or lost the claim of, logged within [start, end)."""
    count = 0
    for line in _text(out).splitlines():
        found = ASK_LINE.match(line) or LOST_LINE.match(line)
        if not found:
            continue
        if start is not None:
            when = datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)
            if not start <= when < end:
                continue
        count += 1
    return count


def _pids(out, *, start: datetime | None = None, end: datetime) -> set[str]:
    """The processes that ran a run logged within [start, end) (from the start without ``start``)."""
    pids = set()
    for line in _text(out).splitlines():
        found = ASK_LINE.match(line)
        if found and (start is None or start <= _when(found)) and _when(found) < end:
            pids.add(found[3])
    return pids


def _when(found: re.Match) -> datetime:
    return datetime.strptime(found[1], "%Y-%m-%d %H:%M:%S").replace(tzinfo=UTC)


def _next_minute(moment: datetime) -> datetime:
    return moment.replace(second=0, microsecond=0) + timedelta(minutes=1)


def _sleep_until(moment: datetime) -> None:
    delay = (moment - datetime.now(UTC)).total_seconds()
    if delay > 0:
        time.sleep(delay)


def _cpu(pid: int) -> float:
    """CPU seconds of ``pid``, of the children it waited for, and of its live descendants (a pool's
    workers, which outlive the window)."""
    try:
        with open(f"/proc/{pid}/stat") as stat:
            fields = stat.read().rsplit(")", 1)[1].split()
        children = [
            int(child)
            for task in os.listdir(f"/proc/{pid}/task")
            for child in _read(f"/proc/{pid}/task/{task}/children")
        ]
    except FileNotFoundError:  # ended meanwhile
        return 0.0
    own = sum(int(value) for value in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    return own + sum(_cpu(child) for child in children)


def _read(path: str) -> list[str]:
    try:
        with open(path) as found:
            return found.read().split()
    except FileNotFoundError:
        return []


def _sessions(db) -> int:
    db.execute("SELECT pg_stat_clear_snapshot()")
    return db.execute("SELECT sessions FROM pg_stat_database WHERE datname = current_database()").fetchone()[
        0
    ]


def _statements(db) -> tuple[int, int]:
    """All statements of the database since the reset, and the transaction-control ones among them."""
    rows = db.execute(
        "SELECT query, calls FROM pg_stat_statements "
        f"WHERE dbid = (SELECT oid FROM pg_database WHERE datname = current_database()) AND {OWN}"
    ).fetchall()
    total = sum(calls for _query, calls in rows)
    control = sum(calls for query, calls in rows if query.lstrip().upper().startswith(CONTROL))
    return total, control


def _once(db, *, first: datetime, minutes: int) -> dict:
    """How the window's slots ran: exactly once (one row, succeeded), twice or more, or never."""
    rows = db.execute(
        "SELECT job_name, tick, count(*), count(*) FILTER (WHERE status = 'succeeded') FROM locks_jobrun "
        "WHERE tick >= %s AND tick < %s GROUP BY job_name, tick",
        (first, first + timedelta(minutes=minutes)),
    ).fetchall()
    once = sum(1 for _job, _tick, count, succeeded in rows if count == 1 and succeeded == 1)
    twice = sum(1 for _job, _tick, count, _succeeded in rows if count > 1)
    return {"once": once, "twice": twice, "seen": len(rows), "runs": sum(row[2] for row in rows)}


# --- the report: side by side with issue 36's table -------------------------------------------

BEGIN, END = "<!-- bench:schedule:begin -->", "<!-- bench:schedule:end -->"
TIMES = "\u00d7"
# Issue 36's table (filed from this code before item 5): CPU-s per replica per minute, forks per
# minute, new PostgreSQL connections per minute, statements per due slot across all replicas.
ISSUE_36 = {"10x1": (0.60, 10, 10, 15), "100x1": (6.0, 100, 100, 15), "300x1": (32, 300, 300, 15)}
ISSUE_36["100x3"] = (7.0, 300, 300, 26.9)


def rows(found: dict) -> list[list[str]]:
    """One row per size measured: each cell "issue 36 / measured"; then whether each slot ran once."""
    out = []
    for size, row in found.items():
        issue = ISSUE_36.get(size, (None,) * 4)
        measured = (
            row["cpu_per_replica_minute"],
            row["forks_per_minute"],
            row["connections_per_minute"],
            row.get("statements_per_slot"),
        )
        cells = [" / ".join(_number(value) for value in pair) for pair in zip(issue, measured, strict=True)]
        once = f"{row['once']}/{row['slots']} (twice {row['twice']}, missed {row['missed']})"
        out.append([size.replace("x", f" {TIMES} "), *cells, once])
    return out


def _number(value) -> str:
    if value is None:
        return "-"
    return f"{value:,.2f}" if value < 10 else f"{value:,.1f}"


def extrapolation(found: dict) -> str:
    """1,000 jobs by 10 replicas from the 100x1 and 100x3 rows (today's code asks every due
    job in every replica: forks and connections grow with jobs times replicas)."""
    one, three = found.get("100x1"), found.get("100x3")
    if not (one and three and "statements_per_slot" in one and "statements_per_slot" in three):
        return ""
    loser = (three["statements_per_slot"] - one["statements_per_slot"]) / 2  # per losing replica
    statements = 1000 * (one["statements_per_slot"] + 9 * loser)
    forks = 1000 * 10 * three["forks_per_minute"] / 300
    connections = 1000 * 10 * three["connections_per_minute"] / 300
    cpu = three["cpu_per_replica_minute"] * 10
    return (
        f"Extrapolated to 1,000 jobs {TIMES} 10 replicas (per minute): about {forks:,.0f} forks, "
        f"{connections:,.0f} new connections, {statements:,.0f} statements (a winner's "
        f"{one['statements_per_slot']:.1f} per slot and {loser:.1f} per losing replica), and "
        f"{cpu:.0f} CPU-s per replica (linear in jobs: a lower bound where a cost grows faster)."
    )


def markdown(results: dict) -> str:
    backend = results["backends"].get("postgresql", {})
    found = backend.get("schedule", {})
    when = backend.get("when", {}).get("schedule", {})
    load = when.get("load", [])
    out = [BEGIN, ""]
    out.append(
        f"Measured {when.get('at', '?')} ({when.get('settings', '')}) on {backend.get('version', '')}, "
        f"{results['environment']['cores']} cores shared with other sessions; load average "
        f"(1/5/15 min) {'/'.join(map(str, load[:3]))} before, {'/'.join(map(str, load[3:]))} after. "
        "Each cell: issue 36's number / this run's."
    )
    out += [
        "",
        f"| jobs {TIMES} replicas | CPU-s per replica per minute | forks / min | new PG connections / min "
        "| statements per due slot (all replicas) | slots run exactly once |",
        "|---|---|---|---|---|---|",
    ]
    out += ["| " + " | ".join(row) + " |" for row in rows(found)]
    line = extrapolation(found)
    out += ["", line] if line else []
    out += ["", END]
    return "\n".join(out)


def print_table(results: dict, stream) -> None:
    found = results["backends"].get("postgresql", {}).get("schedule")
    if not found:
        return
    stream.write("\nrun_scheduler (issue 36 / measured):\n")
    for row in rows(found):
        stream.write("  " + " | ".join(row) + "\n")
    line = extrapolation(found)
    if line:
        stream.write(f"  {line}\n")
