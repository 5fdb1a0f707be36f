"""python -m bench [--postgres URL | --postgres throwaway] [options]

Runs the skip, sync, lock, pruning and reminder fan-out benchmarks on SQLite (a file
under var/bench/) and, when given, on PostgreSQL, and there the scheduler's (``schedule``:
real run_scheduler replicas, bench/schedule.py); prints one table; writes
docs/benchmarks.md (between its bench markers: the reminders have their own, so a run of
that part alone leaves the rest as it is), docs/benchmarks.png and
docs/benchmarks-reminders.png. The PostgreSQL database named by URL has its tables
emptied: give it a throwaway one. ``--postgres throwaway`` runs the whole benchmark again
inside scripts/with-postgres.sh (with durable settings: WITH_POSTGRES_DURABLE=1), on the
cluster it starts and deletes.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from bench import report, runner  # noqa: E402
from bench import schedule as scheduler_part  # noqa: E402
from bench.backends import WORK, PostgreSQL, SQLite  # noqa: E402

PARTS = ("skip", "sync", "lock", "prune", "remind", "schedule")


def _ints(text: str) -> list[int]:
    return [int(item) for item in text.split(",") if item.strip()]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--postgres",
        default=os.environ.get("BENCH_POSTGRES_URL", ""),
        help="postgres://user@host:port/db to benchmark too (its tables are emptied), or 'throwaway' "
        "for a temporary cluster (scripts/with-postgres.sh). Default: $BENCH_POSTGRES_URL.",
    )
    parser.add_argument("--no-sqlite", action="store_true", help="Skip the SQLite default.")
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"Comma-separated: {', '.join(PARTS)} (run in that order)."
    )
    parser.add_argument(
        "--skip-runs", type=int, default=10, help="Runs of the skipping command and of bare Django (median)."
    )
    parser.add_argument("--scales", type=_ints, default=[1, 10, 100], help="Copies of the 1,758 contests.")
    parser.add_argument("--repeat", type=int, default=3, help="Runs per timing (median); naive runs once.")
    parser.add_argument("--naive-max-scale", type=int, default=100, help="Skip the naive loop above this.")
    parser.add_argument("--cycles", type=int, default=1000, help="Lock acquire+release cycles.")
    parser.add_argument("--contenders", type=_ints, default=[2, 8, 32], help="Processes racing for one tick.")
    parser.add_argument("--rounds", type=int, default=3, help="Contention rounds per process count.")
    parser.add_argument(
        "--reminders", type=int, default=1_000_000, help="Reminders for pruning (half stale)."
    )
    parser.add_argument(
        "--remind-sizes",
        type=_ints,
        default=[1_000, 10_000, 20_000],
        help="Due reminders per fan-out run (default 1000,10000,20000).",
    )
    parser.add_argument(
        "--remind-repeat",
        type=int,
        default=5,
        help="Fan-out rounds per size, the approaches alternating (median; a round varies by about 15%%).",
    )
    parser.add_argument(
        "--remind-connections",
        type=_ints,
        default=[1, 2, 4],
        help="SEND_REMINDERS_CONNECTIONS values against the slow server (default 1,2,4).",
    )
    parser.add_argument(
        "--remind-slow-size",
        type=int,
        default=4000,
        help="Due reminders sent to the slow server (default 4000).",
    )
    parser.add_argument(
        "--remind-slow-delay",
        type=float,
        default=0.005,
        help="Seconds the slow server takes to answer each message (default 0.005).",
    )
    parser.add_argument(
        "--sched-sizes",
        type=scheduler_part.parse_sizes,
        default=[(10, 1), (100, 1), (100, 3)],
        help="run_scheduler part (PostgreSQL only): JOBSxREPLICAS, comma-separated (default 10x1,100x1,100x3).",
    )
    parser.add_argument(
        "--sched-minutes", type=int, default=2, help="Whole minutes measured per size (default 2)."
    )
    parser.add_argument(
        "--docs", type=Path, default=ROOT / "docs" / "benchmarks.md", help="Markdown to update."
    )
    parser.add_argument("--no-docs", action="store_true", help="Print only; leave docs/ alone.")
    parser.add_argument(
        "--results",
        type=Path,
        default=WORK / "results.json",
        help="Raw numbers to write (and to read for --merge and --report-only). "
        "Default: var/bench/results.json.",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="Measure nothing: print and write the docs from the results file.",
    )
    parser.add_argument(
        "--merge",
        action="store_true",
        help="Keep the other parts' results from the last run (the results file): rerun one "
        "part when the machine is quieter without redoing the rest.",
    )
    args = parser.parse_args(argv)
    if args.postgres == "throwaway":
        if "WITH_POSTGRES_DATA" not in os.environ:  # not yet inside it: the one throwaway-cluster helper
            script = str(ROOT / "scripts" / "with-postgres.sh")
            os.environ["WITH_POSTGRES_DURABLE"] = "1"  # fsync on, as a real server: these are timings
            if "schedule" in args.parts:  # it counts statements with pg_stat_statements: preloaded
                os.environ.setdefault("WITH_POSTGRES_CONF", "shared_preload_libraries = 'pg_stat_statements'")
            os.execv(  # noqa: S606 (a known script, no shell: the benchmark again, inside it)
                script, [script, sys.executable, "-m", "bench", *(argv if argv is not None else sys.argv[1:])]
            )
        args.postgres = os.environ["DATABASE_URL"]  # the cluster with-postgres.sh started
    parts = {part.strip() for part in args.parts.split(",") if part.strip()}
    unknown = parts - set(PARTS)
    if unknown:
        parser.error(f"unknown part(s): {', '.join(sorted(unknown))}")

    if args.report_only:
        results = json.loads(args.results.read_text())
        report.print_table(results)
        if not args.no_docs:
            report.write_docs(results, args.docs)
        return 0
    settings = {
        "skip": f"median of {args.skip_runs} runs of each, alternating",
        "sync": f"{', '.join(f'{1758 * s:,}' for s in args.scales)} contests; median of {args.repeat} runs, "
        f"{3 * args.repeat} for 1,758 (the naive loop runs once)",
        "lock": f"{args.cycles} cycles; {', '.join(map(str, args.contenders))} contenders, "
        f"{args.rounds} rounds each",
        "prune": f"{args.reminders:,} reminders; median of {args.repeat} runs",
        "remind": f"{', '.join(f'{n:,}' for n in args.remind_sizes)} due reminders, and "
        f"{args.remind_slow_size:,} to a server taking {args.remind_slow_delay * 1000:g} ms a message with "
        f"SEND_REMINDERS_CONNECTIONS {', '.join(map(str, args.remind_connections))}; median of "
        f"{args.remind_repeat} rounds, the approaches alternating",
        "schedule": f"{', '.join(f'{j}x{r}' for j, r in args.sched_sizes)} (jobs x replicas), "
        f"{args.sched_minutes} whole minutes each",
    }
    results: dict = {"environment": report.environment(), "backends": {}}
    previous = args.results
    if args.merge and previous.exists():
        kept = json.loads(previous.read_text())
        results["backends"] = kept.get("backends", {})
    backends = [] if args.no_sqlite else [SQLite()]
    if args.postgres:
        backends.append(PostgreSQL(args.postgres))
    for backend in backends:
        runner.log(f"preparing {backend.name}")
        backend.prepare()
        found: dict = results["backends"].setdefault(backend.name, {})
        found["version"] = backend.version
        jobs = {
            "skip": lambda backend=backend: runner.skip(backend, runs=args.skip_runs),
            "sync": lambda backend=backend: runner.sync(
                backend, scales=args.scales, repeat=args.repeat, naive_max_scale=args.naive_max_scale
            ),
            "lock": lambda backend=backend: runner.lock(
                backend, cycles=args.cycles, contenders=args.contenders, rounds=args.rounds
            ),
            "prune": lambda backend=backend: runner.prune(
                backend, reminders=args.reminders, repeat=args.repeat
            ),
            "remind": lambda backend=backend: runner.remind(
                backend,
                sizes=args.remind_sizes,
                repeat=args.remind_repeat,
                connections=args.remind_connections,
                slow_size=args.remind_slow_size,
                delay=args.remind_slow_delay,
            ),
            "schedule": lambda backend=backend: scheduler_part.schedule(
                backend, sizes=args.sched_sizes, minutes=args.sched_minutes
            ),
        }
        for part, job in jobs.items():
            if part not in parts or (part == "schedule" and backend.name != "postgresql"):
                continue
            load, started = os.getloadavg(), time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime())
            found[part] = job()
            found.setdefault("when", {})[part] = {
                "at": started,
                "load": [round(value, 1) for value in (*load, *os.getloadavg())],
                "settings": settings[part],
            }
        backend.reset()
    results["environment"]["load_after"] = os.getloadavg()

    args.results.parent.mkdir(parents=True, exist_ok=True)
    args.results.write_text(json.dumps(results, indent=2, default=str))
    report.print_table(results)
    if not args.no_docs:
        args.docs.parent.mkdir(parents=True, exist_ok=True)
        written = report.write_docs(results, args.docs)
        print(f"\nwrote {', '.join(map(str, written))} (raw numbers: {args.results})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
