"""Turn the results into one printed table, docs/benchmarks.md and docs/benchmarks.png."""

from __future__ import annotations

import os
import platform
import re
import sys
from datetime import UTC, datetime
from pathlib import Path

TRANSACTION_CONTROL = {"BEGIN", "COMMIT", "SAVEPOINT", "RELEASE", "ROLLBACK"}
BEGIN = "<!-- bench:begin -->"
END = "<!-- bench:end -->"
APPROACH_NAMES = {
    "service": "sync service (in-process)",
    "command": "`sync_contests --force` (whole command)",
    "naive": "naive `update_or_create` loop",
    "floor": "floor (raw driver)",
}


def environment() -> dict:
    import sqlite3

    import django
    import psycopg

    cpu = ""
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            cpu = line.split(":", 1)[1].strip()
            break
    memory = ""
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal"):
            memory = f"{int(line.split()[1]) / 1024 / 1024:.0f} GiB"
    return {
        "date": datetime.now(UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory": memory,
        "kernel": platform.release(),
        "python": sys.version.split()[0],
        "django": django.get_version(),
        "sqlite": sqlite3.sqlite_version,
        "psycopg": psycopg.__version__,
        "load_before": os.getloadavg(),
    }


# --- targets ----------------------------------------------------------------------------


def targets(results: dict) -> list[tuple[str, str, bool | None]]:
    """(target, measured, met) on the SQLite default, for what was measured (issue 11's targets)."""
    rows: list[tuple[str, str, bool | None]] = []
    backend = results["backends"].get("sqlite", {})
    skip = backend.get("skip")
    if skip:
        command, bare = skip["command"], skip["bare"]
        ratio = command["seconds"] / bare["seconds"]
        rows.append(
            (
                "A copy that skips a claimed tick (`sync_contests`): at most 1.5x the wall time of "
                "bare Django (`django.setup()` with minimal settings and one query)",
                f"{ratio:.2f}x ({command['seconds']:.3f} s vs {bare['seconds']:.3f} s, spawn to exit)"
                f"{_cpu(command, bare)}",
                ratio <= 1.5,
            )
        )
    resync = _sync(backend, 1758, "service", "resync")
    if resync:
        rows.append(
            (
                "Resync of unchanged 1,758 contests: at most 4 queries, 0 contest rows written",
                f"{resync['queries']} queries, {resync['rows']} rows",
                resync["queries"] <= 4 and resync["rows"] == 0,
            )
        )
    command, naive = _sync(backend, 17580, "command", "first"), _sync(backend, 17580, "naive", "first")
    if command and naive and "process_seconds" in naive:
        ratio = naive["process_seconds"] / command["seconds"]
        cpu = naive.get("process_cpu", 0) / command["cpu"] if command.get("cpu") else 0
        rows.append(
            (
                "First load of 17,580 contests, whole process: at least 5x faster than the naive loop",
                f"{ratio:.1f}x (`sync_contests --force` {command['seconds']:.2f} s vs the naive loop's "
                f"process {naive['process_seconds']:.2f} s, spawn to exit)"
                + (f"; by CPU time {cpu:.1f}x" if cpu else ""),
                ratio >= 5,
            )
        )
    lock = backend.get("lock")
    if lock:
        latency = lock["latency"]
        besides = latency.get("besides_begin_commit")
        if besides:
            kinds = latency.get("kinds", {})
            sent = "; ".join(
                f"{step}: {', '.join(f'{kind} {count}' for kind, count in found.items())}"
                for step, found in kinds.items()
            )
            rows.append(
                (
                    "Lock: acquire + release in at most 3 statements besides BEGIN and COMMIT",
                    f"{'/'.join(map(str, besides['cycle']))} ({sent})",
                    max(besides["cycle"]) <= 3,
                )
            )
        top = max(lock["contention"], key=int)
        rounds = lock["contention"][top]
        everyone = max(result["all_decided_ms"] for result in rounds)
        winners = [result["winners"] for result in rounds]
        rows.append(
            (
                f"Lock: {top} contenders all decided within 1 s, exactly 1 winner",
                f"last decision {everyone:.0f} ms after the common start; winners per round {winners}",
                everyone < 1000 and all(count == 1 for count in winners),
            )
        )
    return rows


def context(results: dict) -> list[tuple[str, str]]:
    """(what, measured) on the SQLite default: figures worth watching that have no target."""
    rows: list[tuple[str, str]] = []
    backend = results["backends"].get("sqlite", {})
    service, floor = _sync(backend, 17580, "service", "first"), _sync(backend, 17580, "floor", "first")
    if service and floor:
        rows.append(
            (
                "First load at 17,580 against the floor (raw driver), in-process",
                f"{service['seconds'] / floor['seconds']:.2f}x ({service['seconds']:.3f} s vs "
                f"{floor['seconds']:.3f} s){_cpu(service, floor)}",
            )
        )
    big, big_floor = _sync(backend, 175800, "service", "resync"), _sync(backend, 175800, "floor", "resync")
    if big and big_floor:
        rows.append(
            (
                "Resync at 175,800 against its floor, in-process",
                f"{big['seconds'] / big_floor['seconds']:.2f}x ({big['seconds']:.3f} s vs "
                f"{big_floor['seconds']:.3f} s){_cpu(big, big_floor)}",
            )
        )
    if big:
        command = _sync(backend, 175800, "command", "resync")
        extra = f"; whole command {command['peak_mb']:.0f} MB" if command else ""
        rows.append(("Resync at 175,800: peak memory", f"{big['peak_mb']:.0f} MB (in-process run{extra})"))
    small = _sync(backend, 1758, "service", "resync")
    if big and small:
        rows.append(
            (
                "Resync time from 1,758 to 175,800 contests (x100 data)",
                f"x{big['seconds'] / small['seconds']:.0f} ({small['seconds']:.3f} s to {big['seconds']:.3f} s)",
            )
        )
    lock = backend.get("lock")
    if lock:
        cycle = lock["latency"]["cycle"]
        rows.append(
            ("Lock: acquire + release latency", f"p50 {cycle['p50_ms']:.3f} ms, p99 {cycle['p99_ms']:.3f} ms")
        )
    prune = backend.get("prune")
    if prune:
        data = {kind: count for kind, count in prune["kinds"].items() if kind not in TRANSACTION_CONTROL}
        rows.append(
            (
                f"Pruning {prune['deleted']:,} stale of {prune['before']:,} reminders",
                f"{data} plus {prune['queries'] - sum(data.values())} transaction statement(s), "
                f"{prune['seconds']:.2f} s",
            )
        )
    return rows


def _sync(backend: dict, contests: int, approach: str, phase: str) -> dict | None:
    return backend.get("sync", {}).get(str(contests), {}).get(approach, {}).get(phase)


def _cpu(slow: dict, fast: dict) -> str:
    if not slow.get("cpu") or not fast.get("cpu"):
        return ""
    return f"; by CPU time {slow['cpu'] / fast['cpu']:.2f}x"


# --- the printed table ----------------------------------------------------------------------


def table_rows(results: dict) -> list[list[str]]:
    rows = []
    for name, backend in results["backends"].items():
        skip = backend.get("skip")
        if skip:
            for who, label in (("command", "sync_contests, tick claimed"), ("bare", "bare Django")):
                rows.append(
                    [
                        name,
                        "skip",
                        f"{len(skip[who]['runs'])} runs",
                        label,
                        f"{skip[who]['seconds']:.3f}",
                        "",
                        "",
                        f"{skip[who]['peak_mb']:.0f}",
                    ]
                )
        for contests, approaches in backend.get("sync", {}).items():
            for approach, phases in approaches.items():
                for phase, result in phases.items():
                    rows.append(
                        [
                            name,
                            f"sync {phase}",
                            f"{int(contests):,}",
                            approach,
                            f"{result['seconds']:.3f}",
                            str(result.get("queries", "")),
                            f"{result['rows']:,}" if "rows" in result else "",
                            f"{result['peak_mb']:.0f}",
                        ]
                    )
        lock = backend.get("lock")
        if lock:
            latency = lock["latency"]
            for step in ("acquire", "release", "cycle"):
                rows.append(
                    [
                        name,
                        f"lock {step}",
                        f"{latency['cycles']} cycles",
                        f"p50 {latency[step]['p50_ms']:.3f} ms",
                        f"p99 {latency[step]['p99_ms']:.3f} ms",
                        str(latency["statements"].get(step, "-")),
                        "",
                        "",
                    ]
                )
            for count, rounds in lock["contention"].items():
                worst = max(result["max_decide_ms"] for result in rounds)
                rows.append(
                    [
                        name,
                        "lock contention",
                        f"{count} processes",
                        f"winners {[result['winners'] for result in rounds]}",
                        f"{worst / 1000:.3f}",
                        "",
                        "",
                        "",
                    ]
                )
        prune = backend.get("prune")
        if prune:
            rows.append(
                [
                    name,
                    "prune",
                    f"{prune['before']:,}",
                    f"deleted {prune['deleted']:,}",
                    f"{prune['seconds']:.3f}",
                    str(prune["queries"]),
                    f"{prune['rows']:,}",
                    f"{prune['peak_mb']:.0f}",
                ]
            )
    return rows


def print_table(results: dict, stream=sys.stdout) -> None:
    header = ["backend", "part", "size", "approach / result", "seconds", "queries", "rows written", "peak MB"]
    rows = table_rows(results)
    widths = [max(len(str(row[index])) for row in [header, *rows]) for index in range(len(header))]
    line = "  ".join(text.ljust(width) for text, width in zip(header, widths, strict=True))
    stream.write(line + "\n" + "-" * len(line) + "\n")
    for row in rows:
        stream.write("  ".join(text.ljust(width) for text, width in zip(row, widths, strict=True)) + "\n")
    stream.write("\nTargets (SQLite default):\n")
    for target, measured, met in targets(results):
        verdict = "met" if met else "MISSED"
        stream.write(f"  [{verdict:6s}] {target}: {measured}\n")
    stream.write("\nContext (no target):\n")
    for what, measured in context(results):
        stream.write(f"  {what}: {measured}\n")


# --- docs/benchmarks.md ----------------------------------------------------------------------


def markdown(results: dict, *, plot_name: str) -> str:
    env = results["environment"]
    out = [BEGIN, ""]
    out.append(
        f"Measured {env['date']} by `make bench` on {env['cpu']} ({env['cores']} cores, {env['memory']}), "
        f"Linux {env['kernel']}, Python {env['python']}, Django {env['django']}, "
        + ", ".join(backend["version"] for backend in results["backends"].values())
        + f" (psycopg {env['psycopg']}). Each part says when it ran and under what load."
    )
    out += ["", "### Targets (SQLite default)", "", "| target | measured | verdict |", "|---|---|---|"]
    for target, measured, met in targets(results):
        out.append(f"| {target} | {measured} | {'met' if met else '**missed**'} |")
    figures = context(results)
    if figures:
        out += ["", "### Context (SQLite default, no target)", "", "| figure | measured |", "|---|---|"]
        out += [f"| {what} | {measured} |" for what, measured in figures]

    for backend in results["backends"].values():
        skip = backend.get("skip")
        if skip:
            out += [
                "",
                f"### A copy that skips a claimed tick, on {backend['version']}",
                "",
                _when(backend, "skip"),
                "",
                "Wall time from spawn to exit, the process's CPU time and peak RSS (from `wait4`); "
                "the median run, and every run in order.",
                "",
                "| process | seconds (median) | CPU s | peak MB | runs |",
                "|---|---:|---:|---:|---|",
            ]
            for who, label in (
                ("command", "`manage.py sync_contests`, tick already done"),
                ("bare", "bare Django: `django.setup()` (bench/minimal_settings.py) and one query"),
            ):
                found = skip[who]
                out.append(
                    f"| {label} | {found['seconds']:.3f} | {found['cpu']:.3f} | {found['peak_mb']:.0f} "
                    f"| {', '.join(f'{run:.3f}' for run in found['runs'])} |"
                )
            if "output" in skip["command"]:
                out += ["", f"The command's answer: `{skip['command']['output']}`"]
        sync = backend.get("sync")
        if sync:
            out += [
                "",
                f"### Sync on {backend['version']}",
                "",
                _when(backend, "sync"),
                "",
                "*s* is wall time, *CPU s* the measuring process's own CPU time (the database "
                "server's is not in it on PostgreSQL); *queries* as `assertNumQueries` counts them "
                "(BEGIN and COMMIT included); *peak MB* is the process's peak RSS, Django included.",
                "",
                "| contests | approach | first load s | CPU s | queries | rows written | peak MB "
                "| resync s | CPU s | queries | rows written | peak MB |",
                "|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
            ]
            for contests, approaches in sync.items():
                for approach in ("service", "command", "naive", "floor"):
                    if approach not in approaches:
                        continue
                    first, resync = approaches[approach]["first"], approaches[approach]["resync"]
                    out.append(
                        f"| {int(contests):,} | {APPROACH_NAMES[approach]} | "
                        + " | ".join(_cells(first))
                        + " | "
                        + " | ".join(_cells(resync))
                        + " |"
                    )
        lock = backend.get("lock")
        if lock:
            latency = lock["latency"]
            out += [
                "",
                f"### Lock on {backend['version']}",
                "",
                _when(backend, "lock"),
                "",
                f"{latency['cycles']} cycles of acquire + release on a free lease, each on a new tick; "
                f"the measuring process used {latency.get('cpu_ms_per_cycle', float('nan')):.3f} ms of CPU "
                "per cycle.",
                "",
                "| step | statements | besides BEGIN and COMMIT | p50 ms | p99 ms | max ms |",
                "|---|---:|---:|---:|---:|---:|",
            ]
            besides = latency.get("besides_begin_commit", {})
            for step in ("acquire", "release", "cycle"):
                out.append(
                    f"| {step if step != 'cycle' else 'acquire + release'} | "
                    f"{_counts(latency['statements'].get(step))} | {_counts(besides.get(step))} | "
                    f"{latency[step]['p50_ms']:.3f} | {latency[step]['p99_ms']:.3f} | "
                    f"{latency[step]['max_ms']:.3f} |"
                )
            out += [
                "",
                "Contention: N processes connect, wait for one common instant, then all acquire the same "
                "tick. *Decide* is from a process's first query to its answer (won, or skipped and why).",
                "",
                "| processes | rounds | winners per round | slowest decide ms | median decide ms "
                "| all decided after ms | start spread ms |",
                "|---:|---:|---|---:|---:|---:|---:|",
            ]
            cases = [(count, rounds, "") for count, rounds in lock["contention"].items()]
            cases.append(
                (str(lock["first_use"]["processes"]), [lock["first_use"]], " (job row not yet created)")
            )
            for count, rounds, note in cases:
                out.append(
                    f"| {count}{note} | {len(rounds)} | {[result['winners'] for result in rounds]} | "
                    f"{max(r['max_decide_ms'] for r in rounds):.1f} | "
                    f"{max(r['median_decide_ms'] for r in rounds):.1f} | "
                    f"{max(r['all_decided_ms'] for r in rounds):.1f} | "
                    f"{max(r['start_spread_ms'] for r in rounds):.2f} |"
                )
        prune = backend.get("prune")
        if prune:
            out += [
                "",
                f"### Reminder pruning on {backend['version']}",
                "",
                _when(backend, "prune"),
                "",
                "| reminders | stale | deleted | statements | seconds (median) | CPU s | runs | peak MB |",
                "|---:|---:|---:|---|---:|---:|---|---:|",
                f"| {prune['before']:,} | {prune['before'] // 2:,} | {prune['deleted']:,} | "
                f"{prune['queries']} ({', '.join(f'{k} {v}' for k, v in prune['kinds'].items())}) | "
                f"{prune['seconds']:.3f} | {prune.get('cpu', float('nan')):.3f} | {prune['runs']} | "
                f"{prune['peak_mb']:.0f} |",
            ]
    out += ["", f"![Sync time against number of contests]({plot_name})", "", END]
    return "\n".join(out)


def _counts(counts: list[int] | None) -> str:
    return ", ".join(map(str, counts)) if counts else "-"


def _when(backend: dict, part: str) -> str:
    when = backend.get("when", {}).get(part)
    if not when:
        return ""
    load = when["load"]
    return (
        f"Measured {when['at']} ({when['settings']}); load average (1/5/15 min) "
        f"{load[0]}/{load[1]}/{load[2]} before, {load[3]}/{load[4]}/{load[5]} after."
    )


def _cells(result: dict) -> list[str]:
    return [
        f"{result['seconds']:.3f}",
        f"{result['cpu']:.3f}" if "cpu" in result else "-",
        str(result.get("queries", "-")),
        f"{result['rows']:,}" if "rows" in result else "-",
        f"{result['peak_mb']:.0f}",
    ]


def write_markdown(results: dict, path: Path, *, plot_name: str) -> None:
    generated = markdown(results, plot_name=plot_name)
    text = path.read_text() if path.exists() else f"# Benchmarks\n\n{BEGIN}\n{END}\n"
    if BEGIN in text and END in text:
        text = re.sub(re.escape(BEGIN) + r".*?" + re.escape(END), lambda _m: generated, text, flags=re.DOTALL)
    else:
        text = text.rstrip() + "\n\n" + generated + "\n"
    path.write_text(text)


# --- docs/benchmarks.png -----------------------------------------------------------------------

STYLES = {
    "service": ("tab:blue", "o"),
    "command": ("tab:purple", "D"),
    "naive": ("tab:red", "s"),
    "floor": ("tab:green", "^"),
}


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, axes = plt.subplots(1, 2, figsize=(12, 6), sharey=True)
    for axis, phase, title in zip(
        axes, ("first", "resync"), ("First load", "Resync (nothing changed)"), strict=True
    ):
        for name, backend in results["backends"].items():
            sync = backend.get("sync", {})
            dashes = "-" if name == "sqlite" else "--"
            for approach, (color, marker) in STYLES.items():
                points = [
                    (int(contests), approaches[approach][phase]["seconds"])
                    for contests, approaches in sync.items()
                    if approach in approaches
                ]
                if not points:
                    continue
                xs, ys = zip(*sorted(points), strict=True)
                label = f"{APPROACH_NAMES[approach].replace('`', '')}, {backend['version'].split()[0]}"
                axis.plot(xs, ys, dashes, color=color, marker=marker, label=label)
        axis.set_xscale("log")
        axis.set_yscale("log")
        axis.set_xlabel("contests in the list")
        axis.set_title(title)
        axis.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("seconds (log scale)")
    handles, labels = axes[0].get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=4, fontsize=8, frameon=False)
    figure.suptitle("Contest sync: time against the number of contests (solid SQLite, dashed PostgreSQL)")
    figure.tight_layout(rect=(0, 0.1, 1, 1))
    figure.savefig(path, dpi=100)
    plt.close(figure)
