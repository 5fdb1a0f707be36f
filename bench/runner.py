"""The scenarios: each measurement runs in a fresh ``bench.worker`` process."""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime, timedelta

from bench.backends import ROOT, Backend
from bench.data import contest_list_body
from tests.smtp_standin import smtp_standin
from tests.standin import Standin, serve

APPROACHES = ("service", "naive", "floor")


def log(message: str) -> None:
    print(f"[bench {time.strftime('%H:%M:%S')}] {message}", file=sys.stderr, flush=True)


def spawn(argv: list[str], *, env: dict[str, str]) -> dict:
    """Run ``argv`` as a process: wall time from spawn to exit, its CPU time and peak
    memory (from wait4), its output (through files, so a chatty process cannot block)."""
    with tempfile.TemporaryFile() as out, tempfile.TemporaryFile() as err:
        started = time.perf_counter()
        process = subprocess.Popen(argv, cwd=ROOT, env=env, stdout=out, stderr=err)
        _pid, status, usage = os.wait4(process.pid, 0)
        seconds = time.perf_counter() - started
        process.returncode = os.waitstatus_to_exitcode(status)
        out.seek(0)
        err.seek(0)
        return {
            "returncode": process.returncode,
            "seconds": seconds,
            "cpu": usage.ru_utime + usage.ru_stime,
            "peak_mb": round(usage.ru_maxrss / 1024, 1),
            "stdout": out.read().decode(errors="replace"),
            "stderr": err.read().decode(errors="replace"),
        }


def worker(backend: Backend, *args: str, env: dict[str, str] | None = None) -> dict:
    """One ``bench.worker`` task; its own figures, plus ``process_seconds``: the whole
    process from spawn to exit (interpreter, Django start-up and the task), and
    ``process_peak_mb``, its peak RSS (from wait4). ``env``: more variables."""
    done = spawn([sys.executable, "-m", "bench.worker", *args], env=backend.env(**(env or {})))
    if done["returncode"]:
        raise RuntimeError(
            f"bench.worker {' '.join(args)} failed ({done['returncode']}):\n{done['stderr'][-3000:]}"
        )
    result = json.loads(done["stdout"].strip().splitlines()[-1])
    result["process_seconds"], result["process_cpu"] = done["seconds"], done["cpu"]
    result["process_peak_mb"] = done["peak_mb"]
    return result


def command(backend: Backend, api: str, *args: str) -> dict:
    """``manage.py sync_contests`` as an operator or cron runs it, spawn to exit."""
    done = spawn(
        [sys.executable, str(ROOT / "manage.py"), "sync_contests", *args],
        env=backend.env(CODEFORCES_API_URL=api),
    )
    out = done.pop("stdout").strip()
    if done.pop("returncode"):
        raise RuntimeError(f"sync_contests {' '.join(args)} failed:\n{out}\n{done['stderr'][-3000:]}")
    del done["stderr"]
    return {**done, "output": out[-300:]}


def _median(runs: list[dict]) -> dict:
    """The run with the median time; peak memory is the highest seen."""
    ordered = sorted(runs, key=lambda run: run["seconds"])
    chosen = dict(ordered[(len(ordered) - 1) // 2])
    chosen["runs"] = [round(run["seconds"], 4) for run in runs]
    chosen["peak_mb"] = max(run["peak_mb"] for run in runs)
    return chosen


def sync(backend: Backend, *, scales: list[int], repeat: int, naive_max_scale: int) -> dict:
    standin = Standin(b"{}")
    server = serve(standin)
    api = f"http://127.0.0.1:{server.server_port}/api"
    results: dict = {}
    try:
        for scale in scales:
            standin.set_payload(contest_list_body(scale))
            contests = 1758 * scale
            log(f"{backend.name}: sync of {contests:,} contests ({len(standin.body) / 1e6:.1f} MB)")
            row: dict = {}
            for approach in ("floor", "service", "naive", "command"):
                if approach == "naive" and scale > naive_max_scale:
                    continue
                runs: dict[str, list[dict]] = {"first": [], "resync": []}
                # The real list takes tens of milliseconds: more runs keep its median steady.
                runs_wanted = 1 if approach == "naive" else repeat * (3 if scale == 1 else 1)
                for _ in range(runs_wanted):
                    backend.reset()
                    for phase in ("first", "resync"):
                        if approach == "command":
                            result = command(backend, api, "--force")
                        elif approach == "floor":
                            args = ["floor", "--api", api, *backend.floor_args]
                            result = worker(backend, *args, *(["--resync"] if phase == "resync" else []))
                        else:
                            result = worker(backend, approach, "--api", api)
                        runs[phase].append(result)
                row[approach] = {phase: _median(found) for phase, found in runs.items()}
                log(
                    f"  {approach:8s} first {row[approach]['first']['seconds']:8.3f} s"
                    f"  resync {row[approach]['resync']['seconds']:8.3f} s"
                )
            results[str(contests)] = row
    finally:
        server.shutdown()
        server.server_close()
    return results


# --- a copy that skips a claimed tick ---------------------------------------------------

# The floor for a skipping run: bare Django (bench/minimal_settings.py) and one query.
BARE_DJANGO = (
    "import django; django.setup(); from django.db import connection; "
    "cursor = connection.cursor(); "
    "cursor.execute(\"SELECT tick FROM locks_synclock WHERE job_name = 'sync_contests'\"); "
    "cursor.fetchall()"
)


def skip(backend: Backend, *, runs: int) -> dict:
    """``sync_contests`` on a tick another copy already claimed, against bare Django.

    One run claims this hour's tick (and syncs the 1,758 contests); then ``runs``
    runs of the command, each of which must skip, alternate with ``runs`` runs of
    the bare baseline, so both see the same machine.
    """
    standin = Standin(contest_list_body(1))
    server = serve(standin)
    api = f"http://127.0.0.1:{server.server_port}/api"
    backend.reset()
    bare_env = {**backend.env(), "DJANGO_SETTINGS_MODULE": "bench.minimal_settings"}
    skipped: list[dict] = []
    bare: list[dict] = []
    turned = 0
    try:
        command(backend, api)  # claims this hour's tick, and syncs
        while len(skipped) < runs:
            run = command(backend, api)
            if "already done" not in run["output"]:
                # The hour turned and this run claimed the new slot: measure again from here.
                turned += 1
                if turned > 1:
                    raise RuntimeError(f"sync_contests did not skip: {run['output']}")
                skipped.clear()
                bare.clear()
                continue
            skipped.append(run)
            done = spawn([sys.executable, "-c", BARE_DJANGO], env=bare_env)
            if done.pop("returncode"):
                raise RuntimeError(f"the bare Django baseline failed:\n{done['stderr'][-3000:]}")
            del done["stdout"], done["stderr"]
            bare.append(done)
    finally:
        server.shutdown()
        server.server_close()
    result = {"command": _median(skipped), "bare": _median(bare)}
    log(
        f"{backend.name}: skipping run {result['command']['seconds']:.3f} s, "
        f"bare Django {result['bare']['seconds']:.3f} s "
        f"({result['command']['seconds'] / result['bare']['seconds']:.2f}x)"
    )
    return result


# --- the lock -----------------------------------------------------------------------


def lock(backend: Backend, *, cycles: int, contenders: list[int], rounds: int) -> dict:
    backend.reset()
    log(f"{backend.name}: lock latency, {cycles} acquire+release cycles")
    latency = worker(backend, "latency", "--cycles", str(cycles))
    log(f"  p50 {latency['cycle']['p50_ms']:.3f} ms  p99 {latency['cycle']['p99_ms']:.3f} ms")
    contention = {}
    for count in contenders:
        contention[str(count)] = [_contend(backend, count, round_) for round_ in range(rounds)]
        worst = max(result["max_decide_ms"] for result in contention[str(count)])
        winners = [result["winners"] for result in contention[str(count)]]
        log(f"  {count:3d} contenders: winners per round {winners}, slowest decision {worst:.1f} ms")
    first_use = _contend(backend, max(contenders), 0, create=True)
    log(f"  {max(contenders)} contenders on a new job: winners {first_use['winners']}")
    return {"latency": latency, "contention": contention, "first_use": first_use}


def _contend(backend: Backend, count: int, round_: int, *, create: bool = False) -> dict:
    job = f"bench-{'new' if create else 'contend'}-{count}-{round_}"
    tick = datetime(2030, 1, 1, tzinfo=UTC) + timedelta(hours=round_)
    if not create:
        worker(backend, "prepare", "--job", job, "--tick", (tick - timedelta(hours=1)).isoformat())
    processes = [
        subprocess.Popen(
            [sys.executable, "-m", "bench.worker", "contend", "--job", job, "--tick", tick.isoformat()],
            cwd=ROOT,
            env=backend.env(),
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(count)
    ]
    for process in processes:
        line = process.stdout.readline()
        if line.strip() != "ready":
            raise RuntimeError(f"a contender did not start: {line!r} {process.stderr.read()[-2000:]}")
    go = time.monotonic_ns() + 200_000_000
    for process in processes:
        process.stdin.write(f"{go}\n")
        process.stdin.flush()
    outcomes = []
    for process in processes:
        out, err = process.communicate(timeout=120)
        if process.returncode:
            raise RuntimeError(f"a contender failed ({process.returncode}): {err[-2000:]}")
        outcomes.append(json.loads(out.strip().splitlines()[-1]))
    decide = [(outcome["decided"] - outcome["started"]) / 1e6 for outcome in outcomes]
    return {
        "processes": count,
        "winners": sum(outcome["won"] for outcome in outcomes),
        "reasons": sorted({outcome["why"] for outcome in outcomes if not outcome["won"]}),
        "max_decide_ms": max(decide),
        "median_decide_ms": statistics.median(decide),
        "all_decided_ms": (max(outcome["decided"] for outcome in outcomes) - go) / 1e6,
        "start_spread_ms": (max(o["started"] for o in outcomes) - min(o["started"] for o in outcomes)) / 1e6,
    }


# --- reminder pruning -------------------------------------------------------------------

USERS, CONTESTS = 1000, 1000  # 1,000 users x 1,000 contests = 1,000,000 reminders


def prune(backend: Backend, *, reminders: int, repeat: int) -> dict:
    users = max(1, reminders // CONTESTS)
    runs = []
    for _ in range(repeat):
        backend.reset()
        now = datetime.now(UTC).replace(microsecond=0)
        started = time.perf_counter()
        _fill_reminders(backend, users=users, now=now)
        log(f"{backend.name}: {users * CONTESTS:,} reminders built in {time.perf_counter() - started:.1f} s")
        result = worker(backend, "prune", "--now", now.isoformat())
        log(f"  pruned {result['deleted']:,} in {result['seconds']:.3f} s, {result['queries']} statement(s)")
        runs.append(result)
    return _median(runs)


def _fill_reminders(backend: Backend, *, users: int, now: datetime) -> None:
    """Half the contests finished a month ago, half start in a month; every user
    has a reminder for every contest. Written with the raw driver (setup only)."""
    past, future = now - timedelta(days=30), now + timedelta(days=30)
    contests = [
        (
            index + 1,
            "FINISHED" if index < CONTESTS // 2 else "BEFORE",
            past if index < CONTESTS // 2 else future,
        )
        for index in range(CONTESTS)
    ]
    if backend.name == "sqlite":
        _fill_sqlite(backend, users=users, contests=contests, now=now)
    else:
        _fill_postgres(backend, users=users, contests=contests, now=now)


def _text(moment: datetime) -> str:
    return moment.astimezone(UTC).replace(tzinfo=None).isoformat(" ")


def _fill_sqlite(backend: Backend, *, users: int, contests: list, now: datetime) -> None:
    db = backend.raw()
    db.execute("BEGIN")
    db.executemany(
        "INSERT INTO auth_user (id, password, is_superuser, username, first_name, last_name, email, "
        "is_staff, is_active, date_joined) VALUES (?, '!', 0, ?, '', '', '', 0, 1, ?)",
        [(user, f"user{user}", _text(now)) for user in range(1, users + 1)],
    )
    db.executemany(
        "INSERT INTO contests_contest (id, platform, contest_id, name, type, phase, frozen, start_time, "
        "duration, fingerprint, first_seen_at, updated_at) "
        "VALUES (?, 'codeforces', ?, ?, 'CF', ?, 0, ?, 7200000000, '', ?, ?)",
        [
            (pk, pk, f"Contest {pk}", phase, _text(start), _text(now), _text(now))
            for pk, phase, start in contests
        ],
    )
    remind = {pk: _text(start - timedelta(hours=1)) for pk, _phase, start in contests}
    created = _text(now)
    db.executemany(
        "INSERT INTO contests_reminder (remind_at, created_at, contest_id, user_id, attempts, last_error, "
        "claimed_by) VALUES (?, ?, ?, ?, 0, '', '')",
        ((remind[pk], created, pk, user) for user in range(1, users + 1) for pk, _phase, _start in contests),
    )
    db.execute("COMMIT")
    db.close()


def _fill_postgres(backend: Backend, *, users: int, contests: list, now: datetime) -> None:
    with backend.raw() as db, db.transaction(), db.cursor() as cursor:
        cursor.executemany(
            "INSERT INTO auth_user (id, password, is_superuser, username, first_name, last_name, email, "
            "is_staff, is_active, date_joined) VALUES (%s, '!', false, %s, '', '', '', false, true, %s)",
            [(user, f"user{user}", now) for user in range(1, users + 1)],
        )
        cursor.executemany(
            "INSERT INTO contests_contest (id, platform, contest_id, name, type, phase, frozen, start_time, "
            "duration, fingerprint, first_seen_at, updated_at) "
            "VALUES (%s, 'codeforces', %s, %s, 'CF', %s, false, %s, interval '2 hours', '', %s, %s)",
            [(pk, pk, f"Contest {pk}", phase, start, now, now) for pk, phase, start in contests],
        )
        remind = {pk: start - timedelta(hours=1) for pk, _phase, start in contests}
        with cursor.copy(
            "COPY contests_reminder (remind_at, created_at, contest_id, user_id, attempts, last_error, claimed_by) "
            "FROM STDIN"
        ) as copy:
            for user in range(1, users + 1):
                for pk, _phase, _start in contests:
                    copy.write_row((remind[pk], now, pk, user, 0, "", ""))
    with backend.raw() as db:
        # Sequences after explicit ids, and planner statistics as autovacuum would leave them.
        db.execute("SELECT setval('auth_user_id_seq', (SELECT max(id) FROM auth_user))")
        db.execute("SELECT setval('contests_contest_id_seq', (SELECT max(id) FROM contests_contest))")
        db.execute("ANALYZE")


# --- reminder fan-out -------------------------------------------------------------------


def remind(
    backend: Backend, *, sizes: list[int], repeat: int, connections: list[int], slow_size: int, delay: float
) -> dict:
    """``send_reminders`` against the project's own SMTP server on loopback
    (tests/smtp_standin.py, counting only), next to its peer: what a Django user would write
    instead (``django``: one ORM query, ``EmailMessage`` each, ``send_messages`` on one
    connection, the same messages) and the bare-smtplib floor (``floor``).

    ``fast``: N due reminders for each N in ``sizes``, one connection each, a server that
    answers at once. ``slow``: ``slow_size`` due reminders to a server that takes ``delay``
    seconds to answer each message, ``send_reminders`` with each count of ``connections``
    against the peer's one connection. The approaches alternate within each repeat, so that
    each repeat's runs see the same machine; ``ratios`` are per repeat, against that repeat's
    peer (``floor_ratios``: against its floor). Every run's messages are counted at the
    server by recipient: each exactly once."""
    fast: dict = {}
    with smtp_standin(keep=False) as server:
        smtp = {"EMAIL_URL": f"smtp://127.0.0.1:{server.port}"}
        for size in sizes:
            log(f"{backend.name}: reminder fan-out, {size:,} due reminders, a server that answers at once")
            fast[str(size)] = _remind_rounds(
                backend, server, smtp, size=size, repeat=repeat, cases=[("service", 1), ("floor", 1)]
            )
        server.reply_delay = delay
        log(
            f"{backend.name}: {slow_size:,} due reminders, a server that takes {delay * 1000:.0f} ms a message"
        )
        slow = _remind_rounds(
            backend, server, smtp, size=slow_size, repeat=repeat, cases=[("service", c) for c in connections]
        )
    return {"fast": fast, "slow": {"size": slow_size, "delay": delay, "rows": slow}}


def _remind_rounds(backend: Backend, server, smtp: dict, *, size: int, repeat: int, cases: list) -> dict:
    """``repeat`` rounds of the peer and each of ``cases``; the median of each, with every
    round's ratio to that round's peer (and floor, when measured)."""
    runs: dict[str, list[dict]] = {}
    for round_ in range(repeat):
        order = [("django", 1), *cases]
        # Every other round the other way round: a machine that drifts (a cache, a neighbour,
        # the clock speed) over a round favours neither the peer nor the service.
        for approach, count in order if round_ % 2 == 0 else order[::-1]:
            name = approach if count == 1 else f"{approach}-{count}"
            result = _remind_once(backend, server, smtp, approach=approach, count=count, size=size)
            runs.setdefault(name, []).append(result)
            log(f"  round {round_ + 1}: {name:10s} {result['seconds']:8.3f} s")
    row: dict = {}
    for name, found in runs.items():
        row[name] = _median(found)
        row[name]["all_once"] = all(run["delivered_once"] for run in found)
        for versus, key in (("django", "ratios"), ("floor", "floor_ratios")):
            if versus in runs:
                row[name][key] = [
                    round(run["seconds"] / other["seconds"], 3)
                    for run, other in zip(found, runs[versus], strict=True)
                ]
                row[name][f"cpu_{key}"] = [
                    round(run["process_cpu"] / other["process_cpu"], 3)
                    for run, other in zip(found, runs[versus], strict=True)
                ]
    return row


def _remind_once(backend: Backend, server, smtp: dict, *, approach: str, count: int, size: int) -> dict:
    server.received.clear()
    server.per_session.clear()
    if approach == "floor":
        result = worker(backend, "remind-floor", "--port", str(server.port), "--count", str(size))
    else:
        backend.reset()
        worker(backend, "remind-fill", "--count", str(size))
        if approach == "django":
            result = worker(backend, "remind-django", env=smtp)
        else:
            result = worker(backend, "remind", env={**smtp, "SEND_REMINDERS_CONNECTIONS": str(count)})
    with server.lock:
        counts = dict(server.received)
        result["per_session"] = sorted(server.per_session.values(), reverse=True)
    result["received"] = len(counts)
    result["duplicates"] = sum(found - 1 for found in counts.values())
    result["delivered_once"] = len(counts) == size and set(counts.values()) == {1}
    result["peak_mb"] = result["process_peak_mb"]  # the process doing the run
    return result
