"""python -m bench.compare_periodic [--tools locks,periodic_tasks,crontask,dbtasks]

The scenario of bench/compare_periodic/__init__.py for each tool, all at once. Without a PostgreSQL
DATABASE_URL it runs itself again inside scripts/with-postgres.sh.
"""

from __future__ import annotations

import argparse
import datetime as dt
import glob
import json
import os
import re
import signal
import sqlite3
import subprocess
import sys
import threading
import time
from collections import Counter
from pathlib import Path

import psycopg

ROOT = Path(__file__).resolve().parents[2]
SITE = Path(__file__).resolve().parent / "site"
WORK = ROOT / "var" / "compare"
PYTHON313 = os.environ.get("PYTHON313") or next(
    iter(sorted(glob.glob(os.path.expanduser("~/.pyenv/versions/3.13.*/bin/python")))), "python3.13"
)
# Every package of each venv, pinned (django-crontask 2.2 needs Python 3.14: 2.0.1 is the newest
# for 3.13). django-dbtasks' DatabaseBackend stores and runs the tasks of all three.
COMMON = [
    "django==6.1.3",
    "asgiref==3.13.0",
    "sqlparse==0.6.1",
    "psycopg[binary]==3.3.9",
    "django-dbtasks==0.5.0",
]
PINS = {
    "periodic_tasks": [*COMMON, "django-periodic-tasks==0.2.1", "croniter==7.0.0", "python-dateutil==4.0.0"],
    "crontask": [*COMMON, "django-crontask==2.0.1", "apscheduler==3.11.3", "tzlocal==5.4.5"],
    "dbtasks": COMMON,
}
TOOLS = ("locks", "locks_outbox", "periodic_tasks", "crontask", "dbtasks")
TASK_SECONDS = 30  # long enough that the replica killed at S2 + 20 s is in the middle of slot 2's work
SLOTS = 6
KILL, STOP, RESTART, END = (2, 20), (3, 40), (4, 30), (6, 55)  # (slot, seconds after it)


def venv(tool: str) -> Path:
    """var/compare/<tool>, created with the pinned packages (again if the pins changed)."""
    home = WORK / tool
    stamp = home / "pins.txt"
    wanted = "\n".join(PINS[tool]) + "\n"
    if not stamp.exists() or stamp.read_text() != wanted:
        subprocess.run([PYTHON313, "-m", "venv", "--clear", str(home)], check=True)
        pip = [str(home / "bin" / "pip"), "install", "-q", "--disable-pip-version-check"]
        subprocess.run([*pip, *PINS[tool]], check=True)
        stamp.write_text(wanted)
    return home / "bin" / "python"


class Run:
    """One tool's processes, logs and counts."""

    def __init__(self, tool: str, base_url: str) -> None:
        self.tool = tool
        self.url = base_url.rsplit("/", 1)[0] + f"/cmp_{tool}"
        self.dir = WORK / "runs" / tool
        self.hits = self.dir / "hits.jsonl"
        self.replicas: list[subprocess.Popen] = []
        self.workers: list[subprocess.Popen] = []
        self.events: list[str] = []
        self.started = 0
        self.names: dict[int, str] = {}

    # -- processes --------------------------------------------------------------------------------
    def env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "DJANGO_SETTINGS"))}
        env.update(DATABASE_URL=self.url, PYTHONUNBUFFERED="1", CMP_TOOL=self.tool, CMP_HITS=str(self.hits))
        env.update(CMP_TASK_SECONDS=str(TASK_SECONDS), TASK_SECONDS=str(TASK_SECONDS))
        if self.tool.startswith("locks"):
            env.update(
                DJANGO_SETTINGS_MODULE="tests.hostproject.settings",
                DJANGO_DEBUG="1",
                HOSTPROJECT_JOBS=self.job,
                SLOT_TASK_SCHEDULE="* * * * *",
            )
        if self.tool == "locks_outbox":
            # tests.jobsapp.backends.OutsideBackend: each send a row in this file, then run at once.
            env.update(OUTSIDE_TASKS=str(self.dir / "outside.sqlite3"))
        return env

    @property
    def job(self) -> str:
        return "outbox_task" if self.tool == "locks_outbox" else "slot_task"

    def manage(self, *args: str, name: str) -> subprocess.Popen:
        ours = self.tool.startswith("locks")
        python, cwd = (ROOT / ".venv/bin/python", ROOT) if ours else (venv(self.tool), SITE)
        log = (self.dir / f"{name}.log").open("w")
        proc = subprocess.Popen(
            [str(python), "manage.py", *args], cwd=cwd, env=self.env(), stdout=log, stderr=subprocess.STDOUT
        )
        self.names[proc.pid] = name
        return proc

    def prepare(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        self.hits.write_text("")
        with psycopg.connect(self.url.rsplit("/", 1)[0] + "/postgres", autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "cmp_{self.tool}"')
            conn.execute(f'CREATE DATABASE "cmp_{self.tool}"')
        if self.manage("migrate", "-v", "0", name="migrate").wait() != 0:
            raise SystemExit(f"{self.tool}: migrate failed, see {self.dir / 'migrate.log'}")

    def start_replicas(self) -> None:
        for _ in range(3):
            self.started += 1
            name = f"replica{self.started}"
            args = {
                "locks": ["run_scheduler", "slot_task"],
                "locks_outbox": ["run_scheduler", "outbox_task"],
                "periodic_tasks": ["run_scheduler"],
                "crontask": ["crontask", "--no-heartbeat"],
                # A new worker id per process: dbtasks refuses a second runner with a live id.
                "dbtasks": ["taskrunner", "-w", "2", "-i", name],
            }[self.tool]
            self.replicas.append(self.manage(*args, name=name))
        self.note(f"started replicas {[p.pid for p in self.replicas[-3:]]}")

    def start_worker(self) -> None:
        if self.tool == "locks":
            self.workers.append(self.manage("db_worker", "--interval", "1", "--no-reload", name="worker"))
        elif self.tool in ("periodic_tasks", "crontask"):  # dbtasks' runner is its own worker, the outbox's
            self.workers.append(
                self.manage("taskrunner", "--no-periodic", "-w", "2", "-i", "worker", name="worker")
            )

    def note(self, text: str) -> None:
        self.events.append(f"{dt.datetime.now(dt.UTC):%H:%M:%S} {text}")

    def kill_one(self, slot: dt.datetime) -> None:
        live = [p for p in self.replicas if p.poll() is None]
        victim, why, extra = live[0], "the first replica (all are alike)", []
        if self.tool.startswith("locks"):
            holder = self.query(
                "SELECT holder FROM locks_jobrun WHERE job_name = %s AND tick = %s AND status = 'running'",
                self.job,
                slot,
            )
            if holder:
                child = int(holder[0][0].split(":")[1])
                parent = parent_of(child)
                victim = next((p for p in live if p.pid == parent), victim)
                why, extra = f"the replica following slot 2's task (its run: pid {child})", [child]
        elif self.tool == "dbtasks":
            pids = {h["pid"] for h in self.read_hits() if h["event"] == "start" and floor(h["at"]) == slot}
            match = [p for p in live if p.pid in pids]
            if match:
                victim, why = match[0], "the runner running slot 2's task"
        elif self.tool == "periodic_tasks":
            match = [p for p in live if slot_line(self.dir / f"{self.names[p.pid]}.log", slot)]
            if match:
                victim, why = match[0], "the replica that enqueued slot 2"
        for pid in [victim.pid, *extra]:
            os.kill(pid, signal.SIGKILL)
        self.note(f"SIGKILL {victim.pid} {extra or ''}: {why}")

    def stop_replicas(self) -> None:
        live = [p for p in self.replicas if p.poll() is None]
        for proc in live:
            proc.send_signal(signal.SIGTERM)
        for proc in live:
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()
                self.note(f"SIGKILL {proc.pid}: still running 15 s after SIGTERM")
        self.note(f"stopped replicas {[p.pid for p in live]}")

    def stop_all(self) -> None:
        self.stop_replicas()
        for proc in self.workers:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=15)
            except subprocess.TimeoutExpired:
                proc.kill()

    # -- counts -----------------------------------------------------------------------------------
    def query(self, sql: str, *params: object) -> list[tuple]:
        with psycopg.connect(self.url) as conn:
            return conn.execute(sql, params).fetchall()

    def read_hits(self) -> list[dict]:
        return [json.loads(line) for line in self.hits.read_text().splitlines() if line]

    def enqueues(self) -> list[dt.datetime]:
        """The slot of each task row the tool wrote (for dbtasks, rows it deleted unrun too: its logs)."""
        if self.tool == "locks":
            rows = self.query(
                "SELECT args_kwargs->'kwargs'->>'slot' FROM django_tasks_database_dbtaskresult "
                "WHERE task_path = 'tests.jobsapp.tasks.record_slot'"
            )
            return [dt.datetime.fromisoformat(slot) for (slot,) in rows if slot]
        if self.tool == "locks_outbox":  # what OutsideBackend sent
            with sqlite3.connect(self.dir / "outside.sqlite3") as db:
                sent = [json.loads(kwargs) for (kwargs,) in db.execute("SELECT kwargs FROM sent")]
            return [dt.datetime.fromisoformat(kwargs["slot"]) for kwargs in sent if kwargs.get("slot")]
        if self.tool == "dbtasks":
            found = []
            for log in sorted(self.dir.glob("replica*.log")):
                found += re.findall(r"[Ss]cheduled .*? for (\S+ \S+)$", log.read_text(), re.MULTILINE)
            return [dt.datetime.fromisoformat(at) for at in found]
        rows = self.query(
            "SELECT enqueued_at FROM dbtasks_scheduledtask WHERE task_path = 'cmpapp.tasks.tick'"
        )
        return [floor(at.timestamp()) for (at,) in rows]

    def runs(self, event: str) -> list[dt.datetime]:
        if self.tool.startswith("locks"):
            if event == "start":  # record_slot writes its row at the end only, with its slot
                return []
            rows = self.query("SELECT tick FROM jobsapp_slotwrite WHERE job = %s", self.job)
            return [tick for (tick,) in rows]
        return [floor(h["began"]) for h in self.read_hits() if h["event"] == event]

    def safely(self, read) -> object:
        try:
            return read()
        except Exception as exc:  # a tool's table that is not there: said, not fatal
            return repr(exc)

    def ledger(self) -> list:
        """What the tool's own tables say at the end."""
        if self.tool.startswith("locks"):
            sql = "SELECT tick, status, attempt, error FROM locks_jobrun WHERE job_name = %s ORDER BY id"
            return [
                (f"{tick:%H:%M}", status, attempt, error[:120])
                for tick, status, attempt, error in self.query(sql, self.job)
            ]
        rows = self.query(
            "SELECT status, count(*) FROM dbtasks_scheduledtask GROUP BY status ORDER BY status"
        )
        if self.tool == "periodic_tasks":
            rows += self.query(
                "SELECT 'execution ' || status || ' dispatched ' || dispatch_count, count(*) "
                "FROM django_periodic_tasks_taskexecution GROUP BY 1 ORDER BY 1"
            )
        return rows

    def report(self, slots: list[dt.datetime]) -> dict:
        def per_slot(found: list[dt.datetime]) -> dict:
            counts = Counter(f"{at:%H:%M}" for at in found)
            return {label(slots, key): value for key, value in sorted(counts.items())}

        return {
            "tool": self.tool,
            "enqueued": self.safely(lambda: per_slot(self.enqueues())),
            "started": per_slot(self.runs("start")),
            "finished": per_slot(self.runs("end")),
            "ledger": self.safely(self.ledger),
            "events": self.events,
        }


def floor(timestamp: float) -> dt.datetime:
    return dt.datetime.fromtimestamp(timestamp - timestamp % 60, dt.UTC)


def label(slots: list[dt.datetime], minute: str) -> str:
    names = {f"{slot:%H:%M}": f"S{index}" for index, slot in enumerate(slots, 1)}
    return f"{names.get(minute, '-')} {minute}"


def parent_of(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text()
    return int(next(line.split()[1] for line in status.splitlines() if line.startswith("PPid:")))


def slot_line(log: Path, slot: dt.datetime) -> bool:
    """django-periodic-tasks' replica logged an enqueue within the slot's minute."""
    stamp = f"{slot:%Y-%m-%d %H:%M}"
    return any(stamp in line and "Enqueued scheduled task" in line for line in log.read_text().splitlines())


def at(slots: list[dt.datetime], point: tuple[int, int]) -> float:
    slot, seconds = point
    return slots[slot - 1].timestamp() + seconds


def sleep_until(moment: float) -> None:
    time.sleep(max(0.0, moment - time.time()))


def scenario(run: Run, slots: list[dt.datetime], failures: list[str]) -> None:
    try:
        sleep_until(slots[0].timestamp() - 25)
        run.start_worker()
        run.start_replicas()
        sleep_until(at(slots, KILL))
        run.kill_one(slots[KILL[0] - 1])
        sleep_until(at(slots, STOP))
        run.stop_replicas()
        sleep_until(at(slots, RESTART))
        run.start_replicas()
        sleep_until(at(slots, END))
    except Exception as exc:  # one tool's failure leaves the others running
        failures.append(f"{run.tool}: {exc!r}")
        run.note(f"harness error: {exc!r}")
    finally:
        run.stop_all()


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--tools", default=",".join(TOOLS), help="comma-separated, of " + ", ".join(TOOLS))
    tools = parser.parse_args().tools.split(",")
    url = os.environ.get("DATABASE_URL", "")
    if not url.startswith("postgres"):
        script = ROOT / "scripts" / "with-postgres.sh"
        os.execv(str(script), [str(script), sys.executable, "-m", "bench.compare_periodic", *sys.argv[1:]])  # noqa: S606
    runs = [Run(tool, url) for tool in tools]
    for run in runs:
        run.prepare()
    first = floor(time.time() + 60 + 35)  # the first slot at least 35 s away: all started by then
    slots = [first + dt.timedelta(minutes=index) for index in range(SLOTS)]
    print(
        f"slots S1..S{SLOTS}: {slots[0]:%H:%M} .. {slots[-1]:%H:%M} UTC; ends {at(slots, END) - time.time():.0f} s from now"
    )
    failures: list[str] = []
    threads = [threading.Thread(target=scenario, args=(run, slots, failures)) for run in runs]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results = {
        "date": f"{dt.datetime.now(dt.UTC):%Y-%m-%d %H:%M} UTC",
        "slots": [f"{slot:%H:%M}" for slot in slots],
        "python": {tool: PINS.get(tool, "the project's .venv") for tool in tools},
        "failures": failures,
        "tools": [run.report(slots) for run in runs],
    }
    (WORK / "results.json").write_text(json.dumps(results, indent=2, default=str) + "\n")
    print(json.dumps(results, indent=2, default=str))


if __name__ == "__main__":
    main()
