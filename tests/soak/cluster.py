"""The soak's cluster: N ``run_scheduler`` replicas, each reaching PostgreSQL through its own
loopback proxy, and the server itself; with the record of when each part was out of service.

Every replica is a real OS process in its own process group (``tests.faults.support.Proc``),
so a signal reaches a ``faketime`` wrapper and the Python process under it alike. Every wait
is bounded; ``shutdown()`` leaves no process behind, whatever state the soak stopped in.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import subprocess
import sys
import time
from dataclasses import dataclass, field
from datetime import UTC, datetime
from pathlib import Path

from tests.faults.pg import PgServer
from tests.faults.pgproxy import Commit, PgProxy
from tests.faults.support import ROOT, Proc
from tests.soak import timing
from tests.soak.reminders import Kill

# What a replica prints once its scheduler loop runs.
READY = r"^scheduler: running "
START_TIMEOUT = 60
# SIGTERM: the running job's grace, then the time to record it and exit.
STOP_TIMEOUT = timing.GRACE + 15
# The log line of a skipped run (locks.runner.RunResult.describe).
SKIP_LINE = re.compile(
    rf" job={timing.JOB} tick=(?P<tick>\S+) holder=\S+ outcome=skipped reason=(?P<reason>.*) duration=(?P<seconds>[\d.]+)s$"
)
# The fenced write's own renewal: no other statement of a run sets this column (a success's
# release only matches on it in its WHERE, rule 15; the proxies watch and cut only what sets it).
FENCED_RENEWAL = b'"committed_token" = '


class HarnessError(RuntimeError):
    """The soak itself could not go on (a replica that does not start, a server that does not
    come back): not a finding about the lock."""


@dataclass
class Outages:
    """When each part was out of service, in seconds on ``time.time()``: a replica killed,
    stopped, paused or skewed beyond a period (it cannot run the current slot), the
    database down. ``open`` holds the intervals not closed yet."""

    spans: dict[str, list[tuple[float, float]]] = field(default_factory=dict)
    open: dict[str, float] = field(default_factory=dict)

    def begin(self, part: str) -> None:
        self.open.setdefault(part, time.time())

    def end(self, part: str) -> None:
        if part in self.open:
            self.spans.setdefault(part, []).append((self.open.pop(part), time.time()))

    def closed(self) -> dict[str, list[tuple[float, float]]]:
        now = time.time()
        spans = {part: list(found) for part, found in self.spans.items()}
        for part, since in self.open.items():
            spans.setdefault(part, []).append((since, now))
        return spans


@dataclass
class Stop:
    """One SIGTERM and what came of it; or (``asked`` false) a replica found to have exited by itself."""

    replica: str
    at: float
    code: int | None  # None: still running after STOP_TIMEOUT (then SIGKILLed)
    seconds: float
    asked: bool = True


class Replica:
    def __init__(
        self,
        index: int,
        *,
        env: dict[str, str],
        proxy: PgProxy,
        faketime: str | None,
        jobs: tuple[str, ...] = (timing.JOB,),
    ) -> None:
        self.index = index
        self.name = f"r{index + 1}"
        self.env = env
        self.jobs = jobs
        self.proxy = proxy
        self.faketime = faketime
        self.proc: Proc | None = None
        self.incarnations: list[Proc] = []
        self.offsets: list[float] = []  # each incarnation's clock offset
        self.offset = 0.0
        self.paused = False
        self.ended = False  # its process was stopped or killed by the soak, or found exited
        self.kills: list[Kill] = []  # every SIGKILL the soak sent it, with its process group then

    def start(self, *, offset: float = 0.0) -> None:
        prefix: list[str] = []
        if offset:
            if self.faketime is None:
                raise HarnessError("a clock offset needs faketime (Debian package faketime)")
            prefix = [self.faketime, "-f", f"{offset:+.1f}"]
        argv = [*prefix, sys.executable, str(ROOT / "manage.py"), "run_scheduler", *self.jobs]
        self.proc = Proc(argv, env=self.env, name=f"{self.name}.{len(self.incarnations) + 1}")
        self.ended = False
        self.incarnations.append(self.proc)
        self.offsets.append(offset)
        self.offset = offset
        try:
            self.proc.wait_for(READY, timeout=START_TIMEOUT)
        except AssertionError as exc:
            raise HarnessError(f"replica {self.name} did not start: {str(exc)[-2000:]}") from None

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.popen.poll() is None

    def owns(self, pid: int) -> bool:
        """Whether ``pid`` runs in this replica's process group (the Python process under faketime too)."""
        if not self.alive:
            return False
        try:
            return os.getpgid(pid) == self.proc.pid
        except ProcessLookupError:
            return False

    def python_pid(self) -> int:
        """The replica's Python process: the one started, or under faketime the wrapper's child."""
        pid = self.proc.pid
        if self.offset:
            with contextlib.suppress(OSError, ValueError, IndexError):
                return int(Path(f"/proc/{pid}/task/{pid}/children").read_text().split()[0])
        return pid

    def group(self) -> frozenset[int]:
        """Every process in its group now: the scheduler, its runs' children (whose pids name
        their runs' holders), a faketime wrapper."""
        pids = set()
        for entry in Path("/proc").iterdir():
            if entry.name.isdigit():
                with contextlib.suppress(OSError):
                    if os.getpgid(int(entry.name)) == self.proc.pid:
                        pids.add(int(entry.name))
        return frozenset(pids)

    def signal(self, sig: int) -> None:
        """SIGSTOP and SIGCONT reach the whole process group. SIGTERM and SIGKILL reach the Python
        process, so that a faketime wrapper reports its exit status (and cleans up its shared
        memory), then the group, in case a wrapper is left."""
        if not self.alive:
            return
        if sig == signal.SIGKILL:
            self.kills.append(Kill(self.name, time.time(), self.group()))
        if sig in {signal.SIGSTOP, signal.SIGCONT}:
            self.proc.kill(sig)
            self.paused = sig == signal.SIGSTOP
            return
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.python_pid(), sig)
        if sig == signal.SIGKILL:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.popen.wait(timeout=10)
            # The group directly: ``Proc.kill`` skips it once the leader has exited, and its
            # runs' children (a send_reminders run) would outlive the kill and finish their work.
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.popen.pid, sig)

    def terminate(self) -> Stop:
        """SIGTERM, and the exit status within STOP_TIMEOUT; a replica still running then is SIGKILLed."""
        began = time.time()
        self.ended = True
        self.signal(signal.SIGTERM)
        try:
            code = self.proc.popen.wait(timeout=STOP_TIMEOUT)
        except subprocess.TimeoutExpired:
            code = None
            self.kills.append(Kill(self.name, time.time(), self.group()))
            self.proc.kill(signal.SIGKILL)
        return Stop(self.name, began, code, time.time() - began)

    def kill(self) -> None:
        self.ended = True
        if self.paused:
            self.signal(signal.SIGCONT)  # so that a faketime wrapper can reap its child
        self.signal(signal.SIGKILL)

    def save_logs(self, directory: Path) -> list[Path]:
        directory.mkdir(parents=True, exist_ok=True)
        saved = []
        for number, proc in enumerate(self.incarnations, 1):
            path = directory / f"{self.name}.{number}.log"
            path.write_text(
                f"$ {' '.join(proc.argv)}\n# exit {proc.popen.poll()}\n{proc.stderr}\n--- stdout\n{proc.stdout}\n"
            )
            saved.append(path)
        return saved

    def skips(self) -> list[dict]:
        """Every skip this replica logged that the lock row decided (held, tick claimed or
        ahead: not "database unreachable"), with how long the contender took to learn it and
        when it did (``ended``, on ``time.time()``: the line's time less the clock's offset)."""
        found = []
        for proc, offset in zip(self.incarnations, self.offsets, strict=True):
            for line in proc.stderr_lines:
                match = SKIP_LINE.search(line)
                if match is None or match["reason"].startswith("database unreachable"):
                    continue
                logged = datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").replace(tzinfo=UTC)
                found.append(
                    {
                        "replica": proc.name,
                        "tick": datetime.fromisoformat(match["tick"]),
                        "reason": match["reason"],
                        "seconds": float(match["seconds"]),
                        "ended": logged.timestamp() - offset,
                    }
                )
        return found

    def tracebacks(self) -> list[str]:
        """The exception line of each traceback in this replica's stderr, every incarnation."""
        found = []
        for proc in self.incarnations:
            lines = proc.stderr_lines
            for number, line in enumerate(lines):
                if line.startswith("Traceback"):
                    last = next((later for later in lines[number + 1 :] if not later.startswith(" ")), "")
                    found.append(f"{proc.name}: {last}")
        return found


class Cluster:
    """The replicas, their proxies and the server, with the record of outages and SIGTERMs."""

    def __init__(
        self,
        *,
        replicas: int,
        env: dict[str, str],
        db_host: str,
        db_port: int,
        url_for,
        server,
        faketime,
        jobs: tuple[str, ...] = (timing.JOB,),
    ) -> None:
        self.server: PgServer | None = server
        self.outages = Outages()
        self.stops: list[Stop] = []
        self.replicas: list[Replica] = []
        for index in range(replicas):
            proxy = PgProxy((db_host, db_port), watch=FENCED_RENEWAL).start()
            name = f"r{index + 1}"
            replica_env = {**env, "DATABASE_URL": url_for(port=proxy.port, application_name=f"soak-{name}")}
            self.replicas.append(Replica(index, env=replica_env, proxy=proxy, faketime=faketime, jobs=jobs))

    def by_name(self, name: str) -> Replica:
        return next(replica for replica in self.replicas if replica.name == name)

    def start_all(self) -> None:
        for replica in self.replicas:
            replica.start()

    # --- replicas --------------------------------------------------------------------------

    def stop_replica(self, replica: Replica) -> Stop:
        self.outages.begin(replica.name)
        stop = replica.terminate()
        self.stops.append(stop)
        return stop

    def kill_replica(self, replica: Replica) -> None:
        self.outages.begin(replica.name)
        replica.kill()

    def note_exits(self) -> None:
        """A replica that exited without being asked to is a finding (a crash, an exit on an error)."""
        for replica in self.replicas:
            if replica.proc is not None and not replica.alive and not replica.ended:
                replica.ended = True
                self.outages.begin(replica.name)
                self.stops.append(
                    Stop(replica.name, time.time(), replica.proc.popen.poll(), 0.0, asked=False)
                )

    def restart_replica(self, replica: Replica, *, offset: float = 0.0) -> None:
        self.note_exits()
        replica.start(offset=offset)
        if abs(offset) < timing.PERIOD:
            self.outages.end(replica.name)
        else:
            self.outages.begin(replica.name)  # it names another period's slot: no help for this one

    def pause_replica(self, replica: Replica) -> None:
        self.outages.begin(replica.name)
        replica.signal(signal.SIGSTOP)

    def resume_replica(self, replica: Replica) -> None:
        replica.signal(signal.SIGCONT)
        self.outages.end(replica.name)

    # --- the server ------------------------------------------------------------------------

    def stop_server(self, mode: str) -> None:
        self.outages.begin("database")
        self.server.stop(mode)

    def start_server(self) -> None:
        try:
            self.server.start()
        except Exception as exc:  # CalledProcessError, TimeoutExpired
            raise HarnessError(f"PostgreSQL did not start again: {exc}") from None
        self.outages.end("database")

    # --- the proxies -----------------------------------------------------------------------

    def fenced_commits(self) -> list[Commit]:
        """Every fenced write the server committed, as the proxies saw it (not the releases)."""
        return sorted(
            (commit for replica in self.replicas for commit in replica.proxy.commits), key=lambda c: c.sent
        )

    def arm_cuts(self, *, mode: str) -> None:
        for replica in self.replicas:
            replica.proxy.cut_commits(marker=FENCED_RENEWAL, mode=mode)

    def disarm_cuts(self) -> None:
        for replica in self.replicas:
            replica.proxy.disarm()

    # --- the end ---------------------------------------------------------------------------

    def heal(self) -> None:
        """Every fault undone: the server up, no cut armed, every replica running with the right clock."""
        self.note_exits()
        if self.server is not None and not self.server.running():
            self.start_server()
        self.disarm_cuts()
        for replica in self.replicas:
            if replica.paused:
                self.resume_replica(replica)
            if replica.alive and replica.offset:
                self.stop_replica(replica)
            if not replica.alive:
                self.restart_replica(replica)

    def stop_all(self) -> None:
        """SIGTERM to every replica at once, then each one's exit within STOP_TIMEOUT of it."""
        self.note_exits()
        running = [replica for replica in self.replicas if replica.alive]
        began = time.time()
        for replica in running:
            replica.signal(signal.SIGTERM)
        for replica in running:
            try:
                code = replica.proc.popen.wait(timeout=max(began + STOP_TIMEOUT - time.time(), 0.1))
            except subprocess.TimeoutExpired:
                code = None
                replica.kill()
            self.stops.append(Stop(replica.name, began, code, time.time() - began))

    def shutdown(self) -> None:
        """Whatever state the soak stopped in: no process left, proxies closed, the server up."""
        for replica in self.replicas:
            with contextlib.suppress(Exception):
                replica.kill()
            with contextlib.suppress(Exception):
                replica.proxy.stop()
        if self.server is not None and not self.server.running():
            with contextlib.suppress(Exception):
                self.server.start()

    def tracebacks(self) -> list[str]:
        return [line for replica in self.replicas for line in replica.tracebacks()]

    def stderr_lines(self) -> list[str]:
        """Every line every replica wrote to stderr, each incarnation."""
        return [
            line for replica in self.replicas for proc in replica.incarnations for line in proc.stderr_lines
        ]

    def kills(self) -> list[Kill]:
        return sorted((kill for replica in self.replicas for kill in replica.kills), key=lambda kill: kill.at)

    def skips(self) -> list[dict]:
        """Every replica's skips, less those whose wait overlaps that replica's own outage (a
        contender paused by the nemesis in the middle of its acquire waited for SIGCONT, not
        for the lock row)."""
        spans = self.outages.closed()
        return [
            skip
            for replica in self.replicas
            for skip in replica.skips()
            if not any(
                begin < skip["ended"] and skip["ended"] - skip["seconds"] < end
                for begin, end in spans.get(replica.name, ())
            )
        ]
