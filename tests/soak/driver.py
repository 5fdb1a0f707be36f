"""The soak driver: N ``run_scheduler`` replicas under a seeded nemesis, then the checker.

    scripts/with-postgres.sh .venv/bin/python -m tests.soak --seed 17 --duration 600 --replicas 3
        [--nemesis kill,pause,…|all|none] [--catch-up latest|all] [--healthy-slots 3] [--plan]

PostgreSQL only (the nemesis restarts and stops the server): it runs under
``scripts/with-postgres.sh``, creates a database of its own on that cluster
(``soak_<seed>_<pid>``), migrates it with ``tests.soak.settings`` and drops it at the end.

1. **Cluster.** N replicas, ``manage.py run_scheduler soak``, each a real OS process in its own
   process group, each reaching PostgreSQL through its own loopback proxy
   (``tests/faults/pgproxy.py``) and naming itself in ``application_name`` (``soak-r1``…). The
   soak job (``tests.soak.jobs``) writes one ``SlotWrite`` row per slot inside ``fenced()``,
   every 10 s (``tests/soak/timing.py``: schedule, TTL, retry delays, grace).
2. **Nemesis** (``tests.soak.nemesis``): the plan drawn from the seed, run from the first
   slot on for ``--duration`` seconds; every action logged with its time (seconds after the
   first slot). ``--plan`` prints the plan and exits: a seed reproduces it exactly.
3. **The end.** Every fault undone, then ``--healthy-slots`` slots of a healthy cluster (dead
   holders' runs are closed by takeovers, missed slots may be caught up), then SIGTERM to
   every replica, each bounded by ``STOP_TIMEOUT``.
4. **Checker** (``tests.soak.checker``) over the database and the replicas' stderr; the
   record goes to var/soak/ (``last.json`` too), the table and the verdict to stdout:
   exit 0 when every check passed, 1 when one failed, 2 for bad arguments or a missing
   tool, 3 when the soak itself could not run to its end, 130 on Ctrl-C (SIGTERM: 143); its
   replicas are stopped and its database dropped however it ends.

``--catch-up all`` puts ``"catch_up": "all"`` into the soak job's ``LOCKS_JOBS`` entry: the
policy issue 17's soak must pass with (every slot runs, none is excused); ``make soak`` passes
it. Without it the job keeps the default, ``latest``.

**The reminders part** (``--reminders``, which ``make soak`` passes; ``tests.soak.reminders``).
Issue 17's soak also covers reminders under an SMTP server that loses its reply. The SMTP
stand-in (``tests/smtp_standin.py``) serves on loopback for the whole soak and the replicas'
``EMAIL_URL`` points at it (``EMAIL_TIMEOUT`` 2 s); reminders are seeded due evenly through the
soak (``REMINDERS_PER_MINUTE``, two contests, ``tests/contests/reminder_data.py``); every replica
runs ``run_scheduler soak send_reminders``, ``send_reminders`` (the project's entry, from
``config.settings``) on the soak job's 10-second slots through ``SEND_REMINDERS_SCHEDULE``, so
that the nemesis aimed at a run under way hits reminder runs too and a 70-second soak has a
dozen of them (the project's ``* * * * *`` would give one or two); its lease is the soak's TTL
and its claim (``SEND_REMINDERS_CLAIM_TTL``) outlives the longest pause (``tests/soak/timing.py``).
The nemesis gains ``smtp-lost-reply`` (only with ``--reminders``; ``all`` leaves it out
without); the checker gains ``reminder-once``, ``uncertain-not-resent`` and
``reminders-delivered`` (the stand-in's messages against the ``Reminder`` rows).

**On MongoDB** (``--db mongodb``): the database is the ``mongod`` ``MONGODB_URI`` names, else a
SecantusDB server started for the soak (``tests/mongo_server.py``); no ``scripts/with-postgres.sh``.
The replicas reach it directly (no proxy: it reads PostgreSQL's protocol), so the nemesis is
``kill``, ``pause`` and ``term`` only (``all`` means those), a pause aimed at a fenced write aims
at the lease's holder, and no fenced commit is timed. ``make soak-mongodb``.

**The failover nemesis** (``--failover sync|async``; ``tests.soak.failover``). The soak's
database is then a primary and a streaming standby of their own (``tests/faults/replication.py``),
not the cluster of ``scripts/with-postgres.sh``; the replicas' proxies reach it through the
switchable application relay. The nemesis gains ``failover`` (at least one every
``failover.EVERY`` seconds) and loses ``pg-restart`` and ``pg-outage``; the checker gains the
failover checks (``failover.FAILOVER_CHECKS``) and the record its ``replication`` row, which
``python -m tests.soak.report --replication --write`` puts into docs/faults.md.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import secrets
import shlex
import shutil
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from urllib.parse import urlencode, urlsplit, urlunsplit

from tests.conftest import manage
from tests.faults.pg import PgServer
from tests.faults.support import ROOT
from tests.smtp_standin import smtp_standin
from tests.soak import checker, reminders, report, timing
from tests.soak import failover as replication
from tests.soak.cluster import Cluster, HarnessError
from tests.soak.nemesis import FAILOVER, KINDS, SERVER_KINDS, SMTP_KINDS, Nemesis, parse_kinds, plan

MAX_REPLICAS = 8
# The token in the fenced write's renewal, as the proxy sees it (Django binds parameters on
# the client with psycopg 3, so the statement carries the value).
RENEWED_TOKEN = re.compile(rb'"committed_token" = (\d+)')
MAX_DURATION = 24 * 3600
MONGODB_KINDS = ("kill", "pause", "term")  # --db mongodb: the replicas' own faults only


class SoakError(Exception):
    """A bad argument or a missing tool: one line, exit 2."""


class Parser(argparse.ArgumentParser):
    def error(self, message: str):
        raise SoakError(message)


def parse(argv: list[str] | None) -> argparse.Namespace:
    parser = Parser(prog="python -m tests.soak", description=__doc__.split("\n\n")[0])
    parser.add_argument("--seed", type=int, help="Draws the nemesis plan (default: a random one, printed).")
    parser.add_argument("--duration", type=float, default=120, help="Seconds of nemesis (default 120).")
    parser.add_argument("--replicas", type=int, default=3, help=f"run_scheduler replicas, 1-{MAX_REPLICAS}.")
    parser.add_argument("--nemesis", default="all", help=f"Kinds: {','.join(KINDS)}; or all, or none.")
    parser.add_argument(
        "--catch-up",
        choices=("latest", "all"),
        help="The soak job's catch_up key (not set: the default, latest).",
    )
    parser.add_argument(
        "--healthy-slots", type=int, default=3, help="Healthy slots after the nemesis (default 3)."
    )
    parser.add_argument(
        "--reminders",
        action="store_true",
        help="Reminders too: the SMTP stand-in, seeded reminders, send_reminders in every replica.",
    )
    parser.add_argument(
        "--failover",
        choices=replication.MODES,
        help="The database a primary and a standby (synchronous or asynchronous), failed over again and again.",
    )
    parser.add_argument(
        "--db",
        choices=("postgres", "mongodb"),
        default="postgres",
        help="mongodb: MONGODB_URI's server, else a SecantusDB started for the soak (kill, pause, term).",
    )
    parser.add_argument("--records", type=Path, default=report.RECORDS, help="Where the JSON record goes.")
    parser.add_argument(
        "--keep-database", action="store_true", help="Leave the soak's database for a post-mortem."
    )
    parser.add_argument("--plan", action="store_true", help="Print the nemesis plan as JSON lines and exit.")
    args = parser.parse_args(argv)
    if not 1 <= args.replicas <= MAX_REPLICAS:
        raise SoakError(f"--replicas must be 1 to {MAX_REPLICAS}, got {args.replicas}")
    if not timing.PERIOD <= args.duration <= MAX_DURATION:
        raise SoakError(
            f"--duration must be {timing.PERIOD} to {MAX_DURATION} seconds, got {args.duration:g}"
        )
    if not 1 <= args.healthy_slots <= 30:
        raise SoakError(f"--healthy-slots must be 1 to 30, got {args.healthy_slots}")
    try:
        args.kinds = parse_kinds(args.nemesis)
    except ValueError as exc:
        raise SoakError(f"--nemesis: {exc}") from None
    if not args.reminders and SMTP_KINDS & set(args.kinds):
        if args.nemesis.strip() != "all":
            raise SoakError("--nemesis smtp-lost-reply needs --reminders (the SMTP stand-in)")
        args.kinds = tuple(kind for kind in args.kinds if kind not in SMTP_KINDS)
    if FAILOVER in args.kinds and not args.failover:
        raise SoakError("--nemesis failover needs --failover sync|async (two clusters)")
    if args.db == "mongodb":
        if args.failover or args.reminders:
            raise SoakError("--db mongodb runs the soak job only: no --failover, no --reminders")
        if set(args.kinds) - set(MONGODB_KINDS) and args.nemesis.strip() != "all":
            raise SoakError(f"--db mongodb: the nemesis is {', '.join(MONGODB_KINDS)} (or a part of them)")
        args.kinds = tuple(kind for kind in args.kinds if kind in MONGODB_KINDS)
    if args.failover:
        if SERVER_KINDS & set(args.kinds) and args.nemesis.strip() != "all":
            raise SoakError(
                "--failover leaves pg-restart and pg-outage out (the failover kills the primary itself)"
            )
        args.kinds = (*(kind for kind in args.kinds if kind not in SERVER_KINDS | {FAILOVER}), FAILOVER)
    if args.seed is None:
        args.seed = secrets.randbelow(1_000_000)
    return args


def main(argv: list[str] | None = None) -> int:
    try:
        args = parse(argv)
    except SoakError as exc:
        sys.stderr.write(f"soak: error: {exc}\n")
        return 2
    actions = plan(
        seed=args.seed,
        duration=args.duration,
        kinds=args.kinds,
        replicas=args.replicas,
        reminders=args.reminders,
        failover=args.failover or "",
    )
    if args.plan:
        for action in actions:
            sys.stdout.write(json.dumps(action.as_json(), sort_keys=True) + "\n")
        return 0
    # SIGTERM (a CI timeout, a test's cleanup) ends the soak the way Ctrl-C does: through
    # the cleanup below, so that no replica outlives it and its database is dropped.
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    try:
        server, faketime = preflight(args)
        return Soak(args, actions, server=server, faketime=faketime).run()
    except SoakError as exc:
        sys.stderr.write(f"soak: error: {exc}\n")
        return 2
    except HarnessError as exc:
        sys.stderr.write(f"soak: the soak could not run to its end (not a finding about the lock): {exc}\n")
        return 3
    except KeyboardInterrupt:
        sys.stderr.write("soak: interrupted; its replicas are stopped and its database dropped\n")
        return 130


def say(line: str) -> None:
    stamp = datetime.now(UTC).strftime("%H:%M:%S")
    sys.stdout.write(f"{stamp} soak: {line}\n")
    sys.stdout.flush()


def base_env() -> dict[str, str]:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PYTEST")}
    env.update(DJANGO_DEBUG="1", PYTHONUNBUFFERED="1", DJANGO_SETTINGS_MODULE="tests.soak.settings")
    return env


def with_database(url: str, *, name: str | None = None, port: int | None = None, **query: str) -> str:
    """``url`` naming another database, reached on another port, with query options."""
    parts = urlsplit(url)
    userinfo = parts.netloc.rpartition("@")[0]
    netloc = f"{userinfo}@" if userinfo else ""
    netloc += f"{parts.hostname}:{port if port is not None else parts.port or 5432}"
    path = f"/{name}" if name is not None else parts.path
    return urlunsplit(
        parts._replace(netloc=netloc, path=path, query=urlencode(query) if query else parts.query)
    )


def preflight(args: argparse.Namespace) -> tuple[PgServer | None, str | None]:
    """What the soak needs, or SoakError saying what is missing."""
    url = os.environ.get("DATABASE_URL", "")
    if args.db == "mongodb":
        return None, None
    if urlsplit(url).scheme not in {"postgres", "postgresql"}:
        raise SoakError(
            "the soak needs PostgreSQL (it restarts and stops the server): run it under "
            f"scripts/with-postgres.sh (DATABASE_URL is {url or 'not set'!r})"
        )
    if args.failover and (reason := replication.unavailable()):
        raise SoakError(f"--failover: {reason}")
    server = None if args.failover else PgServer.from_environment()
    if server is None and SERVER_KINDS & set(args.kinds):
        raise SoakError(
            "--nemesis pg-restart and pg-outage stop the server, and only one started by "
            "scripts/with-postgres.sh (WITH_POSTGRES_DATA) may be stopped: run under it, or leave them out"
        )
    faketime = shutil.which("faketime")
    if faketime is None and "skew" in args.kinds:
        raise SoakError("--nemesis skew needs faketime (Debian package faketime), or leave it out")
    mail = reminders.replica_env(port=25) if args.reminders else {}  # the real port comes later
    checked = subprocess.run(
        [sys.executable, str(ROOT / "manage.py"), "check"],
        env={**base_env(), "SOAK_CATCH_UP": args.catch_up or "", **mail},
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    if checked.returncode != 0:
        errors = [line.strip() for line in checked.stderr.splitlines() if ": (" in line] or [
            checked.stderr.strip()
        ]
        raise SoakError(f"the system checks refuse the soak's settings: {'; '.join(errors)}")
    return server, faketime


class Soak:
    def __init__(
        self, args: argparse.Namespace, actions, *, server: PgServer | None, faketime: str | None
    ) -> None:
        self.args = args
        self.actions = actions
        self.server = server
        self.faketime = faketime
        self.stamp = datetime.now(UTC).strftime("%Y%m%dT%H%M%SZ")
        self.code = _code_version()  # at the start: the code the replicas run
        self.database = f"soak_{args.seed}_{os.getpid()}"
        self.replication: replication.Replication | None = None
        self.admin_url = os.environ.get("DATABASE_URL", "")
        self.url = with_database(self.admin_url, name=self.database) if args.db == "postgres" else ""

    def _replicate(self) -> None:
        """``--failover``: the soak's own primary and standby, reached through the app relay."""
        started = time.monotonic()
        try:
            self.replication = replication.Replication(self.args.failover, log=say)
        except (AssertionError, RuntimeError, OSError, subprocess.TimeoutExpired) as exc:
            raise HarnessError(f"the primary and its standby could not be made: {exc}") from None
        self.admin_url = self.replication.admin_url
        self.url = with_database(self.admin_url, name=self.database)
        say(
            f"a primary and its {self.args.failover}hronous standby in {time.monotonic() - started:.1f} s; "
            f"the replicas reach the primary through the application relay (port {self.replication.pair.app.port})"
        )

    def _admin(self, sql: str) -> None:
        import psycopg

        try:
            with psycopg.connect(self.admin_url, autocommit=True, connect_timeout=10) as conn:
                conn.execute(sql)
        except psycopg.Error as exc:
            raise HarnessError(f"{sql}: {' '.join(str(exc).split())}") from None

    def run(self) -> int:
        args = self.args
        kinds = ", ".join(args.kinds) or "none"
        say(f"seed {args.seed} ({len(self.actions)} actions planned: {kinds}); reproduce: {self.reproduce()}")
        if args.failover:
            self._replicate()
        if args.db == "mongodb":
            return self._run_on_mongodb()
        try:
            return self._run_in_database()
        finally:
            if self.replication is not None:
                self.replication.destroy()

    def _run_on_mongodb(self) -> int:
        """The soak's own database on MONGODB_URI's server, else on a SecantusDB of its own."""
        from tests.mongo_server import secantusdb
        from tests.test_mongodb import drop_database
        from tests.test_mongodb import with_database as mongodb_database

        with contextlib.ExitStack() as stack:
            uri = os.environ.get("MONGODB_URI")
            if not uri:
                self.args.records.mkdir(parents=True, exist_ok=True)
                log = self.args.records / f"secantusdb-{self.stamp}.log"
                try:
                    # A transaction idle for the lease's TTL is aborted, as PostgreSQL ends one
                    # (bound_transaction): mongod's transactionLifetimeLimitSeconds, set low.
                    uri = stack.enter_context(secantusdb(log=log, transaction_lifetime=timing.TTL))
                except RuntimeError as exc:
                    raise HarnessError(str(exc)) from None
                say(f"SecantusDB on {uri} (MongoDB-compatible, not MongoDB); its log {log}")
            self.url = mongodb_database(uri, self.database)
            try:
                return self._run()
            finally:
                from django.apps import apps

                if apps.ready:
                    from django.db import connections

                    connections.close_all()
                if self.args.keep_database:
                    say(f"database {self.database} kept")
                else:
                    drop_database(self.url)

    def _run_in_database(self) -> int:
        args = self.args
        self._admin(f'CREATE DATABASE "{self.database}"')
        # scripts/with-postgres.sh runs the cluster with synchronous_commit = off: a COMMIT is
        # answered before its WAL is written, and `pg_ctl stop -m immediate` (a crash) then
        # forgets commits it acknowledged. The soak judges what the lock did, not that: its
        # own database commits synchronously (cheap: fsync stays off, a crash of the server
        # process leaves the OS's cache).
        self._admin(f'ALTER DATABASE "{self.database}" SET synchronous_commit = on')
        try:
            return self._run()
        finally:
            from django.apps import apps

            if apps.ready:
                from django.db import connections

                connections.close_all()  # this process's own session on the soak's database
            if self.server is not None and not self.server.running():
                self.server.start()
            if args.keep_database and self.replication is None:
                say(f"database {self.database} kept")
            else:
                self._admin(f'DROP DATABASE IF EXISTS "{self.database}" WITH (FORCE)')

    def _run(self) -> int:
        if not self.args.reminders:
            return self._run_with(smtp=None)
        with smtp_standin() as standin:
            standin.reply_delay = timing.REPLY_DELAY
            standin.idle_timeout = timing.MAX_RUN_TIME  # longer than any pause of a client
            return self._run_with(smtp=standin)

    def _run_with(self, *, smtp) -> int:
        args = self.args
        env = {
            **base_env(),
            "DATABASE_URL": self.url,
            "SOAK_CATCH_UP": args.catch_up or "",
            "LOCKS_LOG_LEVEL": "INFO",
            **(reminders.replica_env(port=smtp.port) if smtp is not None else {}),
        }
        syncdb = ("--run-syncdb",) if args.db == "mongodb" else ()  # tests.jobsapp has no MongoDB migration
        migrated = manage("migrate", "--noinput", "-v", "0", *syncdb, env=env, timeout=300)
        if migrated.returncode != 0:
            raise HarnessError(f"migrate failed: {migrated.stderr.strip()[-2000:]}")
        os.environ.update(env)  # this process reads the soak's database directly, not through a proxy
        import django

        django.setup()
        if smtp is not None:
            # Due from now (the replicas start in a few seconds) to the end of the healthy slots.
            end = time.time() + args.duration + timing.PERIOD * (args.healthy_slots + 1)
            say(
                f"{reminders.seed(start=time.time(), end=end)} reminders seeded, due evenly until {end - time.time():.0f} s from now"
            )

        parts = urlsplit(self.url)
        cluster = Cluster(
            replicas=args.replicas,
            env=env,
            db_host=parts.hostname,
            db_port=parts.port or 5432,
            # On MongoDB the replicas connect directly (their proxies, unused, read PostgreSQL only).
            url_for=lambda *, port, application_name: (
                self.url
                if args.db == "mongodb"
                else with_database(self.url, port=port, application_name=application_name)
            ),
            server=self.server,
            faketime=self.faketime,
            jobs=(timing.JOB, timing.REMINDERS_JOB) if smtp is not None else (timing.JOB,),
        )
        logs = args.records / f"soak-{self.stamp}-seed{args.seed}"
        try:
            cluster.start_all()
            origin = self._next_slot(after=time.time() + 1)
            say(
                f"{args.replicas} replicas running; first slot {origin:%H:%M:%S}, nemesis for {args.duration:g} s"
            )
            nemesis = Nemesis(
                cluster=cluster,
                start=origin.timestamp(),
                holder=lambda: self._holder(cluster),
                # MongoDB: the lease's holder, which spends most of its run inside its fenced write.
                writer=self._writer if args.db == "postgres" else lambda: self._holder(cluster),
                log=say,
                smtp=smtp,
                sender=lambda: self._holder(cluster, job=timing.REMINDERS_JOB),
                replication=self.replication,
                paused=self._paused if smtp is not None else None,
                resume=lambda: self._resume(env),
            )
            done = nemesis.run(self.actions, duration=args.duration)
            if smtp is not None:
                smtp.lose_reply = ""
            cluster.heal()
            first_healthy = self._next_slot(after=time.time())
            last = first_healthy + timedelta(seconds=timing.PERIOD * (args.healthy_slots - 1))
            say(
                f"nemesis over, every fault undone; healthy slots {first_healthy:%H:%M:%S} to {last:%H:%M:%S}"
            )
            self._await_run_of(last, jobs=cluster.replicas[0].jobs)
            cluster.stop_all()
            say("SIGTERM sent to every replica, and each one's exit awaited")
        finally:
            cluster.shutdown()
            for replica in cluster.replicas:
                replica.save_logs(logs)
        return self._judge(cluster, origin=origin, last=last, done=done, logs=logs, smtp=smtp)

    @staticmethod
    def _next_slot(*, after: float) -> datetime:
        from locks.schedule import Schedule

        return Schedule(timing.SCHEDULE).next_slot(datetime.fromtimestamp(after, UTC))

    def _await_run_of(self, last: datetime, *, jobs: tuple[str, ...]) -> None:
        """Until the last slot's run of each job ended, at most until a little before the slot after it."""
        from django.db import Error, connections

        from locks.models import JobRun

        deadline = last.timestamp() + timing.PERIOD - 2
        while time.time() < deadline:
            try:
                runs = JobRun.objects.filter(job_name__in=jobs, tick=last).values_list("job_name", "status")
                ended = {job for job, status in runs if status != checker.RUNNING}
                running = {job for job, status in runs if status == checker.RUNNING}
            except Error:
                connections.close_all()
                ended, running = set(), set()
            if ended >= set(jobs) and not running:
                return
            time.sleep(0.2)

    @staticmethod
    def _holder(cluster: Cluster, *, job: str = timing.JOB) -> str | None:
        """The replica holding ``job``'s lease now (its run may be a child of it), if any."""
        from django.db import Error, connections

        from locks.models import SyncLock

        try:
            holder = SyncLock.objects.for_job(job).held().values_list("holder", flat=True).first()
        except Error:
            connections.close_all()
            return None
        if not holder:
            return None
        pid = int(holder.split(":")[1])
        return next((replica.name for replica in cluster.replicas if replica.owns(pid)), None)

    @staticmethod
    def _paused() -> tuple[str, str] | None:
        """Who paused ``send_reminders`` and the note, if it is paused now."""
        from django.db import Error, connections

        from locks.models import SyncLock

        try:
            row = (
                SyncLock.objects.for_job(timing.REMINDERS_JOB)
                .filter(paused_at__isnull=False)
                .values_list("paused_by", "paused_note")
                .first()
            )
        except Error:
            connections.close_all()
            return None
        return row

    @staticmethod
    def _resume(env: dict[str, str]) -> tuple[bool, str]:
        """``manage.py locks resume send_reminders``, as an operator resumes a job a failover paused."""
        try:
            done = manage("locks", "resume", timing.REMINDERS_JOB, env=env, timeout=60)
        except subprocess.TimeoutExpired:
            return False, "locks resume did not end within 60 s"
        said = (done.stdout.strip() or done.stderr.strip())[-200:]
        return done.returncode == 0 and said.startswith("Resumed"), f"exit {done.returncode}: {said}"

    @staticmethod
    def _ledger(env: dict[str, str]) -> dict[str, str]:
        """The soak job's tick ledger (``locks ticks --json``): each slot's ``failover`` text."""
        done = manage("locks", "ticks", timing.JOB, "--json", "--last", "1000", env=env, timeout=120)
        if done.returncode != 0:
            raise HarnessError(f"locks ticks failed: {done.stderr.strip()[-500:]}")
        return {slot["tick"]: slot["failover"] for slot in json.loads(done.stdout)}

    @staticmethod
    def _writer() -> str | None:
        """The replica inside its fenced write now: its transaction inserted the slot's row and
        has not committed. pg_stat_activity has no model, hence SQL (test code only)."""
        from django.db import Error, connection, connections

        try:
            with connection.cursor() as cursor:
                cursor.execute(
                    "SELECT application_name FROM pg_stat_activity WHERE datname = current_database() "
                    "AND state = 'idle in transaction' AND query LIKE %s AND application_name LIKE 'soak-r%%'",
                    ["%jobsapp_slotwrite%"],
                )
                row = cursor.fetchone()
        except Error:
            connections.close_all()
            return None
        return row[0].removeprefix("soak-") if row else None

    def reproduce(self) -> str:
        args = self.args
        words = ["scripts/with-postgres.sh"] if args.db == "postgres" else []
        words += [".venv/bin/python", "-m", "tests.soak", "--seed", str(args.seed)]
        words += ["--duration", f"{args.duration:g}", "--replicas", str(args.replicas)]
        words += ["--nemesis", ",".join(args.kinds) or "none", "--healthy-slots", str(args.healthy_slots)]
        if args.catch_up:
            words += ["--catch-up", args.catch_up]
        if args.reminders:
            words.append("--reminders")
        if args.failover:
            words += ["--failover", args.failover]
        if args.db == "mongodb":
            words += ["--db", "mongodb"]
        return shlex.join(words)

    def _judge(
        self, cluster: Cluster, *, origin: datetime, last: datetime, done: list[dict], logs: Path, smtp
    ) -> int:
        args = self.args
        window = []
        slot = origin
        while slot <= last:
            window.append(slot)
            slot += timedelta(seconds=timing.PERIOD)
        outages = cluster.outages.closed()
        writes, runs = checker.load()
        fenced = [
            (commit, int(found[1]), replication.tick_of(commit.statement))
            for commit in cluster.fenced_commits()
            if (found := RENEWED_TOKEN.search(commit.statement))
        ]
        failovers = self.replication.done if self.replication is not None else []
        ledger = self._ledger({**os.environ}) if failovers else {}
        skips = cluster.skips()
        stops = [
            {
                "replica": stop.replica,
                "at": stop.at - origin.timestamp(),
                "code": stop.code,
                "seconds": stop.seconds,
                "asked": stop.asked,
            }
            for stop in cluster.stops
        ]

        def label(tick: datetime | None) -> str:
            return "forced" if tick is None else f"+{(tick - origin).total_seconds():.0f}s ({tick:%H:%M:%S})"

        from locks.models import JobRun, SyncLock

        timelines = {
            (tick, token): timeline
            for tick, token, timeline in JobRun.objects.for_job(timing.JOB).values_list(
                "tick", "token", "timeline"
            )
        }
        acks = [replication.Ack(tick, token, commit.committed) for commit, token, tick in fenced]
        lost = set(replication.lost_acks(acks, writes, failovers=failovers, timelines=timelines))
        # Async: the acknowledged writes a failover lost are judged by lost-writes-only-unreplicated.
        commits = [
            checker.FencedCommit(token, commit.committed - commit.sent)
            for (commit, token, _tick), ack in zip(fenced, acks, strict=True)
            if args.failover != "async" or ack not in lost
        ]
        verdict = checker.judge(
            window=window,
            writes=writes,
            runs=runs,
            commits=commits,
            skips=skips,
            kinds=args.kinds,
            kind_of=checker.attribution(done, origin=origin),
            chance=checker.chances(outages, replicas=[replica.name for replica in cluster.replicas]),
            catch_up=args.catch_up or "",
            tracebacks=cluster.tracebacks(),
            stops=stops,
            label=label,
        )
        mail = None
        resends: list[dict] = []
        if smtp is not None:
            from contests.reminders import RECORD_EVERY

            with smtp.lock:
                arrivals = list(smtp.arrivals)
            rows, copies, reminder_runs = reminders.load(arrivals)
            found, mail = reminders.judge(
                reminders=rows,
                copies=copies,
                runs=reminder_runs,
                kills=cluster.kills(),
                last=last,
                origin=origin.timestamp(),
                record_every=RECORD_EVERY,
                failovers=tuple(failover["killed"] for failover in failovers if failover["killed"]),
            )
            resends = mail.pop("failover_resends", [])
            verdict.checks.extend(found)
        failover_checks, replicated = replication.judge(
            mode=args.failover or "one-server",
            failovers=failovers,
            acks=acks,
            writes=writes,
            runs=runs,
            timelines=timelines,
            lock=SyncLock.objects.for_job(timing.JOB)
            .values_list("tick", "tick_done", "committed_token")
            .first(),
            warned=replication.warnings(cluster.stderr_lines()),
            ledger=ledger,
            window=window,
            duration=args.duration,
            reminders=smtp is not None,
            resends=resends,
            label=label,
            job=timing.JOB,
        )
        if self.replication is not None:  # one server: only the replication row (its checks are above)
            verdict.checks.extend(failover_checks)

        for row in verdict.table:
            row["actions"] = sum(action["kind"] == row["kind"] or row["kind"] == "all" for action in done)
        record = {
            "stamp": self.stamp,
            "seed": args.seed,
            "duration": args.duration,
            "replicas": args.replicas,
            "nemesis": list(args.kinds),
            "catch_up": args.catch_up or "",
            "catch_up_text": f"catch_up {args.catch_up!r}"
            if args.catch_up
            else "catch_up not set (the default, latest)",
            "healthy_slots": args.healthy_slots,
            "period": timing.PERIOD,
            "ttl": timing.TTL,
            "code": self.code,
            "started_at": f"{origin:%Y-%m-%d %H:%M} UTC",
            "origin": origin.isoformat(),
            "window": [tick.isoformat() for tick in window],
            "reproduce": self.reproduce(),
            "plan": [action.as_json() for action in self.actions],
            "actions": done,
            "outages": {
                part: [
                    [round(begin - origin.timestamp(), 1), round(end - origin.timestamp(), 1)]
                    for begin, end in spans
                ]
                for part, spans in outages.items()
            },
            "stops": stops,
            "tracebacks": cluster.tracebacks(),
            "checks": [check.as_json() for check in verdict.checks],
            "table": verdict.table,
            "reminders": mail,
            "failover": args.failover or "",
            "db": args.db,
            "failovers": [
                replication.relative(failover, origin=origin.timestamp()) for failover in failovers
            ],
            "replication": replicated,
            "kills": [
                {
                    "replica": kill.replica,
                    "at": round(kill.at - origin.timestamp(), 2),
                    "pids": sorted(kill.pids),
                }
                for kill in cluster.kills()
            ],
            "slots": verdict.slots,
            "stale": verdict.stale,
            "running": verdict.running,
            "waits": verdict.waits,
            "fenced_commits": {
                "seen": len(commits),
                "longest_seconds": round(max((commit.seconds for commit in commits), default=0), 2),
            },
            "passed": verdict.passed,
            "logs": str(logs.relative_to(ROOT)) if logs.is_relative_to(ROOT) else str(logs),
        }
        path = report.save(record, directory=args.records)
        sys.stdout.write("\n" + report.render(record) + "\n\n")
        say(f"{'PASS' if verdict.passed else 'FAIL'} seed {args.seed}; record {path}; replica logs {logs}")
        return 0 if verdict.passed else 1


def _code_version() -> str:
    """The commit under test, ``+changes`` when the work tree differs from it."""
    try:
        head = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True, timeout=10
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            timeout=10,
        ).stdout.strip()
    except (OSError, subprocess.TimeoutExpired):
        return "unknown"
    return f"{head}+changes" if dirty else head or "unknown"
