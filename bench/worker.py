"""One measurement in a fresh process: ``python -m bench.worker TASK [options]``.

Each task prints one JSON object on its last stdout line. A fresh process per
measurement keeps peak memory honest and stops one approach's caches from
helping the next. The database comes from ``DATABASE_URL`` (Django) or, for the
raw-driver floor, from ``--sqlite PATH`` / ``--pg CONNINFO``.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

PLATFORM = "codeforces"
CONTEST_TABLE = "contests_contest"
CONTEST_COLUMNS = (
    "platform",
    "contest_id",
    "name",
    "type",
    "phase",
    "frozen",
    "start_time",
    "duration",
    "fingerprint",
    "first_seen_at",
    "updated_at",
    "removed_at",
)
_WRITE = re.compile(r'^\s*(?:INSERT\s+INTO|UPDATE|DELETE\s+FROM)\s+"?(\w+)"?', re.IGNORECASE)


def peak_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def cpu_seconds() -> float:
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return 0.0


def setup_django() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()


class Meter:
    """Counts the statements Django sends and the rows they write, per table.

    Installed with ``connection.execute_wrapper``; counts what
    ``CaptureQueriesContext`` would (BEGIN included, COMMIT not). Rows written
    come from SQLite's ``total_changes`` (attributed to the statement that ran
    before, since SQLite counts RETURNING statements only once their rows are
    read) or from the driver's ``rowcount`` on PostgreSQL.
    """

    def __init__(self, connection) -> None:
        self.connection = connection
        self.statements = 0
        self.kinds: dict[str, int] = {}
        self.rows: dict[str, int] = {}
        self._sqlite = connection.vendor == "sqlite"
        self._last_table: str | None = None
        self._mark = 0

    def __enter__(self) -> Meter:
        connection = self.connection
        connection.ensure_connection()
        if self._sqlite:
            self._mark = connection.connection.total_changes
        self._wrapper = connection.execute_wrapper(self)
        self._wrapper.__enter__()
        # COMMIT, ROLLBACK and (outside SQLite) BEGIN are driver calls, not
        # cursor statements; CaptureQueriesContext lists them, so count them too.
        commit, rollback, set_autocommit = (
            connection._commit,
            connection._rollback,
            connection._set_autocommit,
        )

        def counted(kind, call):
            def wrapper(*args):
                self._flush()
                self._count(kind)
                self._last_table = None
                return call(*args)

            return wrapper

        def autocommit(value):
            if not value:
                self._count("BEGIN")
            return set_autocommit(value)

        connection._commit = counted("COMMIT", commit)
        connection._rollback = counted("ROLLBACK", rollback)
        connection._set_autocommit = autocommit
        return self

    def __exit__(self, *exc) -> None:
        self._wrapper.__exit__(*exc)
        for name in ("_commit", "_rollback", "_set_autocommit"):
            self.connection.__dict__.pop(name, None)
        self._flush()

    def _count(self, kind: str) -> None:
        self.statements += 1
        self.kinds[kind] = self.kinds.get(kind, 0) + 1

    def _flush(self) -> None:
        if not self._sqlite or self.connection.connection is None:
            return
        total = self.connection.connection.total_changes
        if self._last_table and total != self._mark:
            self.rows[self._last_table] = self.rows.get(self._last_table, 0) + total - self._mark
        self._mark = total

    def __call__(self, execute, sql, params, many, context):
        self._flush()
        self._count(sql.lstrip().split(None, 1)[0].upper())
        match = _WRITE.match(sql)
        self._last_table = match.group(1) if match else None
        result = execute(sql, params, many, context)
        if not self._sqlite and match:
            count = context["cursor"].rowcount
            if count and count > 0:
                self.rows[self._last_table] = self.rows.get(self._last_table, 0) + count
        return result


def emit(result: dict) -> None:
    result.setdefault("peak_mb", round(peak_mb(), 1))
    print(json.dumps(result, default=str), flush=True)


# --- the three ways to sync ---------------------------------------------------


def sync_service(api_url: str) -> dict:
    """This project's service, under a lease as the job runs it (the lease is
    taken before the clock starts; its fencing renewal is part of the sync)."""
    setup_django()
    from django.db import connection

    from contests.codeforces import CodeforcesClient
    from contests.services import sync_codeforces_contests
    from locks import acquire, release

    lease = acquire(job="bench-sync", tick=None, ttl=timedelta(minutes=30))
    client = CodeforcesClient(base_url=api_url)
    start_rss = rss_mb()
    with Meter(connection) as meter:
        started, cpu = time.perf_counter(), cpu_seconds()
        stats = sync_codeforces_contests(client=client, lease=lease)
        seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    release(lease=lease, status="succeeded")
    return {
        "seconds": seconds,
        "queries": meter.statements,
        "kinds": meter.kinds,
        "rows": meter.rows.get(CONTEST_TABLE, 0),
        "stats": stats.as_dict(),
        "cpu": cpu,
        "start_mb": round(start_rss, 1),
    }


def naive_sync(api_url: str) -> dict:
    """What a developer writes first: one ``update_or_create`` per contest."""
    setup_django()
    import requests
    from django.db import connection
    from django.utils import timezone

    from contests.models import Contest, Platform

    start_rss = rss_mb()
    with Meter(connection) as meter:
        started, cpu = time.perf_counter(), cpu_seconds()
        response = requests.get(f"{api_url}/contest.list", params={"gym": "false"}, timeout=60)
        response.raise_for_status()
        now = timezone.now()
        for entry in response.json()["result"]:
            start = entry.get("startTimeSeconds")
            Contest.objects.update_or_create(
                platform=Platform.CODEFORCES,
                contest_id=entry["id"],
                defaults={
                    "name": entry["name"],
                    "type": entry["type"],
                    "phase": entry["phase"],
                    "frozen": entry["frozen"],
                    "start_time": datetime.fromtimestamp(start, tz=UTC) if start is not None else None,
                    "duration": timedelta(seconds=entry["durationSeconds"]),
                    "updated_at": now,
                },
            )
        seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    return {
        "seconds": seconds,
        "cpu": cpu,
        "queries": meter.statements,
        "kinds": meter.kinds,
        "rows": meter.rows.get(CONTEST_TABLE, 0),
        "start_mb": round(start_rss, 1),
    }


def _fetch(requests, api_url: str) -> list[dict]:
    response = requests.get(f"{api_url}/contest.list", params={"gym": "false"}, timeout=60)
    response.raise_for_status()
    return json.loads(response.content)["result"]


def floor_sync(api_url: str, *, sqlite: str | None, pg: str | None, resync: bool) -> dict:
    """The floor: fetch, parse, and one ``executemany`` through the raw driver
    (first load) or one read of the stored keys (resync). No Django."""
    import requests  # imported before the clock starts, as the others are

    start_rss = rss_mb()
    if sqlite:
        import sqlite3

        db = sqlite3.connect(sqlite, isolation_level=None)
        db.execute("PRAGMA synchronous=NORMAL")  # as config/database.py sets it
        marker = "?"
    else:
        import psycopg

        db = psycopg.connect(pg)
        marker = "%s"
    started, cpu = time.perf_counter(), cpu_seconds()
    entries = _fetch(requests, api_url)
    if resync:
        stored = {
            key
            for (key,) in db.execute(
                f"SELECT contest_id FROM {CONTEST_TABLE} WHERE platform = {marker}", (PLATFORM,)
            ).fetchall()
        }
        new = [entry for entry in entries if entry["id"] not in stored]
        rows_written = 0
        extra = {"new": len(new), "queries": 1}
    else:
        rows = _floor_rows(entries, sqlite=bool(sqlite))
        sql = (
            f"INSERT INTO {CONTEST_TABLE} ({', '.join(CONTEST_COLUMNS)}) "
            f"VALUES ({', '.join([marker] * len(CONTEST_COLUMNS))})"
        )
        if sqlite:
            db.execute("BEGIN IMMEDIATE")
            rows_written = db.executemany(sql, rows).rowcount
            db.execute("COMMIT")
        else:
            with db.cursor() as cursor:
                cursor.executemany(sql, rows)
                rows_written = cursor.rowcount
            db.commit()
        extra = {"queries": 3}  # BEGIN, the executemany, COMMIT
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    db.close()
    return {"seconds": seconds, "cpu": cpu, "rows": rows_written, "start_mb": round(start_rss, 1), **extra}


def _floor_rows(entries: list[dict], *, sqlite: bool) -> list[tuple]:
    """Rows as the backend stores them: the same values Django would write,
    except the fingerprint, which only this project's diff needs."""
    now = datetime.now(UTC)
    if sqlite:
        # Django's SQLite adapter stores UTC text and durations in microseconds.
        now_text = now.replace(tzinfo=None).isoformat(" ")
        return [
            (
                PLATFORM,
                entry["id"],
                entry["name"],
                entry["type"],
                entry["phase"],
                entry["frozen"],
                time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(entry["startTimeSeconds"]))
                if "startTimeSeconds" in entry
                else None,
                entry["durationSeconds"] * 1_000_000,
                "",
                now_text,
                now_text,
                None,
            )
            for entry in entries
        ]
    return [
        (
            PLATFORM,
            entry["id"],
            entry["name"],
            entry["type"],
            entry["phase"],
            entry["frozen"],
            datetime.fromtimestamp(entry["startTimeSeconds"], tz=UTC)
            if "startTimeSeconds" in entry
            else None,
            timedelta(seconds=entry["durationSeconds"]),
            "",
            now,
            now,
            None,
        )
        for entry in entries
    ]


# --- the lock -------------------------------------------------------------------


def lock_latency(*, cycles: int, warmup: int) -> dict:
    """acquire + release of a free lease on a scheduled tick, ``cycles`` times.

    The warm-up cycles count statements; the timed ones run bare.
    """
    setup_django()
    from django.db import connection

    from locks import Lease, acquire, release

    job, ttl = "bench-latency", timedelta(minutes=5)
    base = datetime(2030, 1, 1, tzinfo=UTC)
    first = acquire(job=job, tick=base, ttl=ttl)  # creates the row: not the happy path
    release(lease=first, status="succeeded")
    # Every statement, and those besides BEGIN and COMMIT, per step of each warm-up cycle.
    statements: dict[str, set[int]] = {"acquire": set(), "release": set(), "cycle": set()}
    besides: dict[str, set[int]] = {"acquire": set(), "release": set(), "cycle": set()}
    kinds: dict[str, dict[str, int]] = {}
    for index in range(1, warmup + 1):
        cycle = every = 0
        for step in ("acquire", "release"):
            with Meter(connection) as meter:
                if step == "acquire":
                    lease = acquire(job=job, tick=base + timedelta(hours=index), ttl=ttl)
                else:
                    release(lease=lease, status="succeeded")
            statements[step].add(meter.statements)
            count = meter.statements - meter.kinds.get("BEGIN", 0) - meter.kinds.get("COMMIT", 0)
            besides[step].add(count)
            kinds[step] = meter.kinds
            cycle += count
            every += meter.statements
        besides["cycle"].add(cycle)
        statements["cycle"].add(every)
    acquire_ns, release_ns, cycle_ns = [], [], []
    clock = time.perf_counter_ns
    cpu = cpu_seconds()
    for index in range(warmup + 1, warmup + cycles + 1):
        tick = base + timedelta(hours=index)
        t0 = clock()
        lease = acquire(job=job, tick=tick, ttl=ttl)
        t1 = clock()
        released = release(lease=lease, status="succeeded")
        t2 = clock()
        if not isinstance(lease, Lease) or not released:
            raise SystemExit(f"cycle {index}: expected to take and give back the free lease, got {lease}")
        acquire_ns.append(t1 - t0)
        release_ns.append(t2 - t1)
        cycle_ns.append(t2 - t0)
    cpu = cpu_seconds() - cpu
    return {
        "cycles": cycles,
        "cpu_ms_per_cycle": cpu * 1000 / cycles,
        "cycle": _percentiles(cycle_ns),
        "acquire": _percentiles(acquire_ns),
        "release": _percentiles(release_ns),
        "statements": {key: sorted(value) for key, value in statements.items()},
        "besides_begin_commit": {key: sorted(value) for key, value in besides.items()},
        "kinds": kinds,
    }


def _percentiles(samples_ns: list[int]) -> dict:
    ordered = sorted(samples_ns)

    def pick(fraction: float) -> float:
        index = min(len(ordered) - 1, max(0, round(fraction * len(ordered)) - 1))
        return ordered[index] / 1e6

    return {"p50_ms": pick(0.50), "p99_ms": pick(0.99), "max_ms": ordered[-1] / 1e6}


def contend(*, job: str, tick: str, ttl: float) -> None:
    """One contender: connect, say ready, wait for the common start instant
    (``time.monotonic_ns`` is one clock for every process on the host), acquire."""
    setup_django()
    from django.db import connection

    from locks import Lease, acquire

    connection.ensure_connection()
    print("ready", flush=True)
    go = int(sys.stdin.readline())
    while (wait := go - time.monotonic_ns()) > 2_000_000:
        time.sleep((wait - 1_000_000) / 1e9)
    while time.monotonic_ns() < go:
        pass
    started = time.monotonic_ns()
    got = acquire(job=job, tick=datetime.fromisoformat(tick), ttl=timedelta(seconds=ttl))
    decided = time.monotonic_ns()
    emit(
        {
            "started": started,
            "decided": decided,
            "won": isinstance(got, Lease),
            "why": "" if isinstance(got, Lease) else got.reason,
        }
    )


def lock_prepare(*, job: str, tick: str) -> dict:
    """Create ``job``'s row and leave it free, so contenders race on the
    steady-state UPDATE rather than on the first INSERT."""
    setup_django()
    from locks import acquire, release

    lease = acquire(job=job, tick=datetime.fromisoformat(tick), ttl=timedelta(minutes=5))
    release(lease=lease, status="succeeded")
    return {"job": job}


# --- reminder pruning -------------------------------------------------------------


def prune(*, now: str) -> dict:
    setup_django()
    from django.db import connection

    from contests.models import Reminder
    from contests.services import prune_stale_reminders

    before = Reminder.objects.count()
    with Meter(connection) as meter:
        started, cpu = time.perf_counter(), cpu_seconds()
        deleted = prune_stale_reminders(now=datetime.fromisoformat(now))
        seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    return {
        "seconds": seconds,
        "cpu": cpu,
        "queries": meter.statements,
        "kinds": meter.kinds,
        "deleted": deleted,
        "before": before,
        "after": Reminder.objects.count(),
        "rows": meter.rows.get("contests_reminder", 0),
    }


# --- reminder fan-out ----------------------------------------------------------------

FLOOR_SENDER = "reminders@localhost"


def remind_fill(*, count: int) -> dict:
    """One contest starting in two hours and ``count`` due reminders, one per user
    (``r<n>@example.com``), written with bulk inserts (setup, not measured)."""
    setup_django()
    from django.contrib.auth import get_user_model
    from django.contrib.auth.hashers import make_password
    from django.utils import timezone

    from contests.models import Contest, Reminder

    now = timezone.now()
    contest = Contest.objects.create(
        contest_id=1,
        name="Codeforces Round 1000 (Div. 2)",
        type="CF",
        phase="BEFORE",
        start_time=now + timedelta(hours=2),
        duration=timedelta(hours=2),
        fingerprint="",
        updated_at=now,
    )
    user_model, unusable = get_user_model(), make_password(None)
    user_model.objects.bulk_create(
        (user_model(username=f"r{n}", email=f"r{n}@example.com", password=unusable) for n in range(count)),
        batch_size=2000,
    )
    users = user_model.objects.filter(username__startswith="r").values_list("pk", flat=True).iterator()
    Reminder.objects.bulk_create(
        (Reminder(user_id=pk, contest=contest, remind_at=now - timedelta(minutes=5)) for pk in users),
        batch_size=2000,
    )
    return {"reminders": Reminder.objects.count()}


def remind_service() -> dict:
    """``send_reminders`` as its job runs (``locks.runner.run_job``, forced: lease,
    heartbeat, JobRun), statements counted by what they are for: claiming (the batch
    claims, the reads back, settling exhausted ones), recording (attempts, deliveries),
    and the rest (the lease and the run's record). Only the main thread's statements
    are counted: with one connection, all of them."""
    setup_django()
    from django.db import connection

    from contests import reminders
    from locks import run_job

    meter = PhaseMeter(connection)
    for name in ("claim_batch", "claimed_reminders", "settle_exhausted"):
        setattr(reminders, name, meter.counted_as("claim", getattr(reminders, name)))
    real_group = reminders._Group

    class Group(real_group):
        def __init__(self, *args, **kwargs):
            with meter.phase_of("record"):
                super().__init__(*args, **kwargs)

        def record(self, *args, **kwargs):
            with meter.phase_of("record"):
                return super().record(*args, **kwargs)

    reminders._Group = Group
    start_rss = rss_mb()
    with meter:
        started, cpu = time.perf_counter(), cpu_seconds()
        result = run_job(name="send_reminders", force=True)
        seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    if result.outcome.recorded != "succeeded":
        raise SystemExit(f"send_reminders did not succeed: {result.describe()}")
    return {
        "seconds": seconds,
        "cpu": cpu,
        "stats": result.stats,
        "statements": meter.phases,
        "statement_seconds": {phase: round(spent, 4) for phase, spent in meter.seconds.items()},
        "kinds": meter.kinds,
        "start_mb": round(start_rss, 1),
    }


class PhaseMeter(Meter):
    """A ``Meter`` that also counts statements per phase ("other" outside any)."""

    def __init__(self, connection) -> None:
        super().__init__(connection)
        self.phase = "other"
        self.phases: dict[str, int] = {"claim": 0, "record": 0, "other": 0}
        self.seconds: dict[str, float] = {"claim": 0.0, "record": 0.0, "other": 0.0}  # in execute

    def _count(self, kind: str) -> None:
        super()._count(kind)
        self.phases[self.phase] += 1

    def __call__(self, execute, sql, params, many, context):
        started = time.perf_counter()
        try:
            return super().__call__(execute, sql, params, many, context)
        finally:
            self.seconds[self.phase] += time.perf_counter() - started

    def phase_of(self, phase: str):
        meter = self

        class Phase:
            def __enter__(self):
                self.before, meter.phase = meter.phase, phase

            def __exit__(self, *exc):
                meter.phase = self.before

        return Phase()

    def counted_as(self, phase: str, function):
        def counted(*args, **kwargs):
            with self.phase_of(phase):
                found = function(*args, **kwargs)
                if hasattr(found, "__next__"):  # a streamed read runs as it is consumed
                    return self._streamed(phase, found)
                return found

        return counted

    def _streamed(self, phase: str, rows):
        while True:
            with self.phase_of(phase):
                row = next(rows, None)
            if row is None:
                return
            yield row


def remind_django() -> dict:
    """What a Django user would write instead of ``send_reminders`` (the peer): one ORM query
    for the due reminders, Django's ``EmailMessage`` for each (the same messages:
    ``reminder_message``), ``get_connection().send_messages()`` on one connection of Django's
    own SMTP backend (``EMAIL_URL``). No claims, no records, no exactly-once."""
    setup_django()
    from django.core.mail import get_connection
    from django.db.models.functions import Now

    from contests.mail import reminder_message
    from contests.models import Reminder

    start_rss = rss_mb()
    started, cpu = time.perf_counter(), cpu_seconds()
    due = list(Reminder.objects.due().select_related("user", "contest").annotate(db_now=Now()))
    messages = [reminder_message(reminder=reminder, now=reminder.db_now) for reminder in due]
    sent = get_connection().send_messages(messages)
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    if sent != len(due):
        raise SystemExit(f"Django's send_messages sent {sent} of {len(due)}")
    return {"seconds": seconds, "cpu": cpu, "sent": sent, "start_mb": round(start_rss, 1)}


def remind_floor(*, port: int, count: int) -> dict:
    """The floor: bare ``smtplib`` handing ``count`` similar messages (the reminder's headers
    and a body of its size, built with an f-string) to the server over one connection.
    No Django, no database."""
    import smtplib
    from email.utils import formatdate

    start_rss = rss_mb()
    started, cpu = time.perf_counter(), cpu_seconds()
    with smtplib.SMTP("127.0.0.1", port, timeout=10) as smtp:
        for n in range(count):
            to = f"r{n}@example.com"
            link = f"https://contests.example.com/reminders/unsubscribe/{n:024d}:{'s' * 43}/"
            body = (
                "Codeforces Round 1000 (Div. 2) starts on Wednesday 02 December 2026, 12:00 UTC, "
                "in 1 hour, 55 minutes.\r\n\r\nContest page: https://codeforces.com/contest/1\r\n\r\n"
                f"You get this email because r{n} asked for a reminder.\r\n"
                f"No more reminders for this contest: {link}\r\nNo more reminders at all: {link}\r\n"
            )
            message = (
                'Content-Type: text/plain; charset="utf-8"\r\nMIME-Version: 1.0\r\n'
                "Content-Transfer-Encoding: 7bit\r\n"
                "Subject: Reminder: Codeforces Round 1000 (Div. 2) starts 2026-12-02 12:00 UTC\r\n"
                f"From: {FLOOR_SENDER}\r\nTo: {to}\r\nDate: {formatdate()}\r\n"
                f"Message-ID: <reminder-{n}@localhost>\r\nAuto-Submitted: auto-generated\r\n"
                f"List-Unsubscribe: \r\n <{link}>\r\nList-Unsubscribe-Post: List-Unsubscribe=One-Click\r\n"
                f"\r\n{body}"
            )
            smtp.sendmail(FLOOR_SENDER, [to], message.encode())
    seconds, cpu = time.perf_counter() - started, cpu_seconds() - cpu
    return {"seconds": seconds, "cpu": cpu, "start_mb": round(start_rss, 1)}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.worker")
    sub = parser.add_subparsers(dest="task", required=True)
    for name in ("service", "naive", "floor"):
        task = sub.add_parser(name)
        task.add_argument("--api", required=True)
        if name == "floor":
            task.add_argument("--sqlite")
            task.add_argument("--pg")
            task.add_argument("--resync", action="store_true")
    latency = sub.add_parser("latency")
    latency.add_argument("--cycles", type=int, default=1000)
    latency.add_argument("--warmup", type=int, default=20)
    for name in ("contend", "prepare"):
        task = sub.add_parser(name)
        task.add_argument("--job", required=True)
        task.add_argument("--tick", required=True)
        task.add_argument("--ttl", type=float, default=60)
    pruning = sub.add_parser("prune")
    pruning.add_argument("--now", required=True)
    sub.add_parser("remind-fill").add_argument("--count", type=int, required=True)
    sub.add_parser("remind")
    sub.add_parser("remind-django")
    floor = sub.add_parser("remind-floor")
    floor.add_argument("--port", type=int, required=True)
    floor.add_argument("--count", type=int, required=True)
    args = parser.parse_args(argv)

    if args.task == "service":
        emit(sync_service(args.api))
    elif args.task == "naive":
        emit(naive_sync(args.api))
    elif args.task == "floor":
        emit(floor_sync(args.api, sqlite=args.sqlite, pg=args.pg, resync=args.resync))
    elif args.task == "latency":
        emit(lock_latency(cycles=args.cycles, warmup=args.warmup))
    elif args.task == "contend":
        contend(job=args.job, tick=args.tick, ttl=args.ttl)
    elif args.task == "prepare":
        emit(lock_prepare(job=args.job, tick=args.tick))
    elif args.task == "prune":
        emit(prune(now=args.now))
    elif args.task == "remind-fill":
        emit(remind_fill(count=args.count))
    elif args.task == "remind":
        emit(remind_service())
    elif args.task == "remind-django":
        emit(remind_django())
    elif args.task == "remind-floor":
        emit(remind_floor(port=args.port, count=args.count))


if __name__ == "__main__":
    main()
