"""Turn the results into one printed table, docs/benchmarks.md and docs/benchmarks.png."""

from __future__ import annotations

import os
import platform
import re
import statistics
import sys
from datetime import UTC, datetime
from pathlib import Path

from bench import schedule

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
        for label, size, approach, result in _remind_results(backend):
            statements = result.get("statements", {})
            queries = f"claim {statements['claim']}, record {statements['record']}" if statements else ""
            rows.append(
                [
                    name,
                    f"remind {label}",
                    f"{size:,}",
                    approach,
                    f"{result['seconds']:.3f}",
                    queries,
                    "each once" if result.get("all_once") else f"{result.get('duplicates', '?')} duplicates",
                    f"{result['peak_mb']:.0f}",
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
    schedule.print_table(results, stream)
    found = reminder_targets(results)
    if found:
        stream.write("\nReminder fan-out targets (issues 28 and 20):\n")
        for backend, target, measured, met in found:
            stream.write(f"  [{'met' if met else 'MISSED':6s}] {backend}: {target}: {measured}\n")


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
    _replace_block(path, BEGIN, END, markdown(results, plot_name=plot_name))


def _replace_block(path: Path, begin: str, end: str, generated: str) -> None:
    text = path.read_text() if path.exists() else "# Benchmarks\n"
    if begin in text and end in text:
        text = re.sub(re.escape(begin) + r".*?" + re.escape(end), lambda _m: generated, text, flags=re.DOTALL)
    else:
        text = text.rstrip() + "\n\n" + generated + "\n"
    path.write_text(text)


CLASSIC_PARTS = ("skip", "sync", "lock", "prune")


def write_docs(results: dict, path: Path) -> list[Path]:
    """The sections and plots of what was measured: the classic parts' block and plot, the
    reminder fan-out's block and plot (each only when its parts are in ``results``, so a
    run of one leaves the other as it was). The files written."""
    backends = results["backends"].values()
    written = []
    if any(part in backend for backend in backends for part in CLASSIC_PARTS):
        plot_path = path.with_suffix(".png")
        plot(results, plot_path)
        write_markdown(results, path, plot_name=plot_path.name)
        written += [path, plot_path]
    if any("remind" in backend for backend in backends):
        plot_path = path.with_name(f"{path.stem}-reminders.png")
        plot_reminders(results, plot_path)
        _replace_block(path, REMIND_BEGIN, REMIND_END, reminder_markdown(results, plot_name=plot_path.name))
        written += [*([] if written else [path]), plot_path]
    if any("schedule" in backend for backend in backends):
        _replace_block(path, schedule.BEGIN, schedule.END, schedule.markdown(results))
        written += [] if path in written else [path]
    return written


# --- the reminder fan-out ---------------------------------------------------------------------

REMIND_BEGIN = "<!-- bench:reminders:begin -->"
REMIND_END = "<!-- bench:reminders:end -->"
REMIND_NAMES = {
    "service": "`send_reminders`, 1 connection",
    "django": "Django's own: one query, `EmailMessage` each, `send_messages` on 1 connection",
    "floor": "floor: bare smtplib, messages built with an f-string, 1 connection",
}


def _remind_name(approach: str) -> str:
    if approach.startswith("service-"):
        return f"`send_reminders`, {approach.split('-', 1)[1]} connections"
    return REMIND_NAMES[approach]


def _remind_results(backend: dict):
    """(scenario, size, approach, result) of every reminder run measured on ``backend``."""
    remind = backend.get("remind") or {}
    for size, row in remind.get("fast", {}).items():
        for approach, result in row.items():
            yield "fast", int(size), approach, result
    slow = remind.get("slow")
    if slow:
        for approach, result in slow["rows"].items():
            yield "slow", slow["size"], approach, result


def _per_reminder(result: dict, phase: str, size: int) -> float:
    return result["statements"][phase] / size


def _listed(values: list[float]) -> str:
    return ", ".join(f"{value:.2f}" for value in values)


def reminder_targets(results: dict) -> list[tuple[str, str, str, bool]]:
    """(backend, target, measured, met) for issue 28's targets (and issue 20's, kept), on every
    backend measured."""
    rows = []
    for backend in results["backends"].values():
        remind = backend.get("remind")
        if not remind or "fast" not in remind:
            continue
        name = backend["version"].split(" (")[0]
        fast = remind["fast"]
        sizes = sorted(fast, key=int)
        big, small, n = fast[sizes[-1]], fast[sizes[0]], int(sizes[-1])
        service, peer = big["service"], big["django"]
        ratio = statistics.median(service["ratios"])
        rows.append(
            (
                name,
                f"{n:,} due reminders on one connection: at most 1.15x Django's own send of the same messages "
                "(issue 28)",
                f"{ratio:.2f}x, the median of each round's ratio [{_listed(service['ratios'])}] (median times "
                f"{service['seconds']:.2f} s vs {peer['seconds']:.2f} s); by process CPU time "
                f"{statistics.median(service['cpu_ratios']):.2f}x",
                ratio <= 1.15,
            )
        )
        slow = remind.get("slow")
        four = slow and slow["rows"].get("service-4")
        if four:
            ratio = statistics.median(four["ratios"])
            one = slow["rows"].get("service")
            speedup = f"; 4 connections are {one['seconds'] / four['seconds']:.2f}x one" if one else ""
            rows.append(
                (
                    name,
                    f"{slow['size']:,} due reminders to a server that takes {slow['delay'] * 1000:g} ms a message, "
                    "4 connections: at most 0.35x Django's own send on one connection (issue 28)",
                    f"{ratio:.2f}x, the median of each round's ratio [{_listed(four['ratios'])}] (median times "
                    f"{four['seconds']:.2f} s vs {slow['rows']['django']['seconds']:.2f} s){speedup}",
                    ratio <= 0.35,
                )
            )
        floor = statistics.median(service["floor_ratios"])
        rows.append(
            (
                name,
                f"{n:,} due reminders, one connection: at most 2x the bare-smtplib floor to the same server "
                "(issue 20)",
                f"{floor:.2f}x, the median of each round's ratio [{_listed(service['floor_ratios'])}] "
                f"(median times {service['seconds']:.2f} s vs {big['floor']['seconds']:.2f} s)",
                floor <= 2,
            )
        )
        once = all(
            result.get("all_once")
            for _label, _size, approach, result in _remind_results(backend)
            if approach != "floor"
        )
        rows.append(
            (
                name,
                "each reminder delivered exactly once (counted at the server by recipient)",
                "every run, every size" if once else "**not** in every run: see the duplicates column",
                once,
            )
        )
        rows.append(
            (
                name,
                f"peak memory of the process doing the run at {n:,}: at most 200 MiB",
                f"{service['peak_mb']:.0f} MiB",
                service["peak_mb"] <= 200,
            )
        )
        growth = service["peak_mb"] / small["service"]["peak_mb"] - 1
        rows.append(
            (
                name,
                f"peak memory flat in N: at most 20% growth from {int(sizes[0]):,} to {n:,}",
                f"{growth * 100:+.1f}% ({small['service']['peak_mb']:.0f} to {service['peak_mb']:.0f} MiB)",
                growth <= 0.2,
            )
        )
        claim, record = _per_reminder(service, "claim", n), _per_reminder(service, "record", n)
        rows.append(
            (
                name,
                "at most 0.1 queries per reminder for claiming, at most 1 for recording",
                f"claiming {claim:.4f}, recording {record:.4f} ({service['statements']['claim']} and "
                f"{service['statements']['record']} statements; {service['statements']['other']} for the lease "
                "and the run's record)",
                claim <= 0.1 and record <= 1,
            )
        )
    return rows


def reminder_markdown(results: dict, *, plot_name: str) -> str:
    env = results["environment"]
    out = [REMIND_BEGIN, ""]
    out.append(
        f"Measured {env['date']} by `make bench` on {env['cpu']} ({env['cores']} cores, {env['memory']}), "
        f"Linux {env['kernel']}, Python {env['python']}, Django {env['django']}, "
        + ", ".join(backend["version"] for backend in results["backends"].values() if "remind" in backend)
        + "."
    )
    out += [
        "",
        "### Reminder fan-out targets (issues 28 and 20; shown for each backend)",
        "",
        "| backend | target | measured | verdict |",
        "|---|---|---|---|",
    ]
    for backend, target, measured, met in reminder_targets(results):
        out.append(f"| {backend} | {target} | {measured} | {'met' if met else '**missed**'} |")
    for backend in results["backends"].values():
        remind = backend.get("remind")
        if not remind or "fast" not in remind:
            continue
        slow = remind.get("slow")
        out += [
            "",
            f"### Reminder fan-out on {backend['version']}",
            "",
            _when(backend, "remind"),
            "",
            "*s*: wall time of the run (for `send_reminders`: the lease, claims, every message, records, the "
            "run's own record; for Django's own: the query, building and sending); *x Django*: against "
            "Django's own send at the same N, per round (the approaches alternate within a round, so each "
            "round's runs share the machine's load); *process CPU s*: the CPU time of the whole process "
            "(start-up included), which waiting for a busy core does not inflate; *claim* and *record*: "
            "statements per reminder, as Django sends them (main thread); *peak MiB*: the peak RSS of the "
            "process doing the run, Django included (from `wait4`); *per connection*: the messages each "
            "SMTP session carried, at the server.",
            "",
            "| server | due reminders | approach | s (median) | x Django (each round) | runs | process CPU s "
            "| claim / reminder | record / reminder | peak MiB | per connection | each delivered once |",
            "|---|---:|---|---:|---:|---|---:|---:|---:|---:|---|---|",
        ]
        for label, size, approach, result in _remind_results(backend):
            server = "answers at once" if label == "fast" else f"{slow['delay'] * 1000:g} ms a message"
            cells = ["-", "-"]
            if result.get("statements") and approach == "service":
                cells = [
                    f"{_per_reminder(result, 'claim', size):.4f}",
                    f"{_per_reminder(result, 'record', size):.4f}",
                ]
            once = "yes" if result.get("all_once") else f"no ({result.get('duplicates')} duplicates)"
            sessions = ", ".join(map(str, result.get("per_session", []))) or "-"
            out.append(
                f"| {server} | {size:,} | {_remind_name(approach)} | {result['seconds']:.3f} | "
                f"{_listed(result.get('ratios', []))} | {_listed(result['runs'])} | "
                f"{result.get('process_cpu', float('nan')):.2f} | "
                + " | ".join(cells)
                + f" | {result['peak_mb']:.0f} | {sessions} | {once} |"
            )
    out += [
        "",
        f"![Reminder fan-out: time against due reminders and against connections, peak memory]({plot_name})",
        "",
        REMIND_END,
    ]
    return "\n".join(out)


PLOT_LABELS = {
    "service": "send_reminders",
    "django": "Django's own send",
    "floor": "floor: bare smtplib",
}


def plot_reminders(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, (times, slow_axis, memory) = plt.subplots(1, 3, figsize=(16, 5.5))
    styles = {"service": ("tab:blue", "o"), "django": ("tab:orange", "D"), "floor": ("tab:green", "^")}
    for name, backend in results["backends"].items():
        remind = backend.get("remind")
        if not remind or "fast" not in remind:
            continue
        dashes = "-" if name == "sqlite" else "--"
        engine = backend["version"].split()[0]
        for approach, (color, marker) in styles.items():
            points = sorted((int(size), row[approach]) for size, row in remind["fast"].items())
            xs = [size for size, _ in points]
            label = f"{PLOT_LABELS[approach]}, {engine}"
            times.plot(xs, [r["seconds"] for _, r in points], dashes, color=color, marker=marker, label=label)
            memory.plot(
                xs, [r["peak_mb"] for _, r in points], dashes, color=color, marker=marker, label=label
            )
        slow = remind.get("slow")
        if slow:
            rows = slow["rows"]
            counts = sorted(
                int(key.split("-")[1]) if "-" in key else 1 for key in rows if key.startswith("service")
            )
            seconds = [rows["service" if c == 1 else f"service-{c}"]["seconds"] for c in counts]
            slow_axis.plot(
                counts, seconds, dashes, color="tab:blue", marker="o", label=f"send_reminders, {engine}"
            )
            slow_axis.plot(
                counts,
                [seconds[0] / c for c in counts],
                ":",
                color="tab:gray",
                label=f"one connection / N, {engine}",
            )
            slow_axis.axhline(
                rows["django"]["seconds"],
                linestyle=dashes,
                color="tab:orange",
                label=f"Django's own, 1 connection, {engine}",
            )
            slow_axis.set_title(
                f"{slow['size']:,} reminders, a server taking {slow['delay'] * 1000:g} ms a message"
            )
            slow_axis.set_xticks(counts)
    times.set_title("Wall time, one connection, a server that answers at once")
    times.set_ylabel("seconds")
    times.set_xlabel("due reminders")
    slow_axis.set_xlabel("SEND_REMINDERS_CONNECTIONS")
    slow_axis.set_ylabel("seconds")
    slow_axis.set_ylim(bottom=0)
    slow_axis.legend(fontsize=7)
    memory.set_title("Peak RSS of the process doing the run")
    memory.set_ylabel("MiB")
    memory.set_xlabel("due reminders")
    memory.set_ylim(bottom=0)
    for axis in (times, slow_axis, memory):
        axis.grid(True, alpha=0.3)
    handles, labels = times.get_legend_handles_labels()
    figure.legend(handles, labels, loc="lower center", ncol=3, fontsize=8, frameon=False)
    figure.suptitle("Reminder fan-out against a loopback SMTP server (solid SQLite, dashed PostgreSQL)")
    figure.tight_layout(rect=(0, 0.1, 1, 1))
    figure.savefig(path, dpi=100)
    plt.close(figure)


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
