"""Processes, servers and waits for the fault tests.

Every wait is bounded in time and every loop in count; every process started
here is killed (its whole process group) when the test ends.
"""

from __future__ import annotations

import contextlib
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

# What `sync_contests` prints on stdout (and logs) at the end of a run.
RESULT_LINE = re.compile(r"^job=\S+ tick=(?P<tick>\S+) holder=(?P<holder>\S+) outcome=(?P<outcome>\w+)")


class Proc:
    """A real OS process with its output collected line by line as it comes."""

    def __init__(self, argv: list[str], *, env: dict[str, str], name: str = "") -> None:
        self.name = name or " ".join(argv[-3:])
        self.argv = argv
        self.started = time.monotonic()
        self.popen = subprocess.Popen(
            argv,
            cwd=ROOT,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            # Its own process group: wrappers (faketime forks) die with it.
            start_new_session=True,
        )
        self.stdout_lines: list[str] = []
        self.stderr_lines: list[str] = []
        self._changed = threading.Condition()
        self._readers = [
            threading.Thread(target=self._read, args=(self.popen.stdout, self.stdout_lines), daemon=True),
            threading.Thread(target=self._read, args=(self.popen.stderr, self.stderr_lines), daemon=True),
        ]
        for reader in self._readers:
            reader.start()

    def _read(self, stream, lines: list[str]) -> None:
        for line in stream:
            with self._changed:
                lines.append(line.rstrip("\n"))
                self._changed.notify_all()
        with self._changed:
            self._changed.notify_all()

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def stdout(self) -> str:
        return "\n".join(self.stdout_lines)

    @property
    def stderr(self) -> str:
        return "\n".join(self.stderr_lines)

    def wait_for(self, pattern: str, *, timeout: float, stream: str = "stderr") -> re.Match:
        """The first line of ``stream`` matching ``pattern``; fails after ``timeout`` seconds."""
        lines = self.stderr_lines if stream == "stderr" else self.stdout_lines
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        with self._changed:
            while True:
                for line in lines:
                    if found := regex.search(line):
                        return found
                remaining = deadline - time.monotonic()
                if remaining <= 0 or (self.popen.poll() is not None and not self._reading()):
                    raise AssertionError(
                        f"{self.name}: no {stream} line matching {pattern!r} within {timeout:g} s "
                        f"(exit {self.popen.poll()})\n{self.transcript()}"
                    )
                self._changed.wait(min(remaining, 0.5))

    def _reading(self) -> bool:
        return any(reader.is_alive() for reader in self._readers)

    def wait(self, *, timeout: float) -> int:
        """The exit status; the test fails (and the process is killed) after ``timeout`` seconds."""
        try:
            code = self.popen.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(
                f"{self.name}: still running after {timeout:g} s\n{self.transcript()}"
            ) from None
        for reader in self._readers:
            reader.join(timeout=5)
        return code

    def kill(self, sig: int = signal.SIGKILL) -> None:
        if self.popen.poll() is None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.popen.pid, sig)
        if sig == signal.SIGKILL:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=10)

    def result(self) -> dict[str, str]:
        """tick, holder and outcome from the run's result line on stdout."""
        for line in reversed(self.stdout_lines):
            if found := RESULT_LINE.match(line):
                return found.groupdict()
        raise AssertionError(f"{self.name}: no result line on stdout\n{self.transcript()}")

    def field(self, name: str) -> str | None:
        """A ``name=value`` field of the result line (None when absent)."""
        for line in reversed(self.stdout_lines):
            if RESULT_LINE.match(line):
                found = re.search(rf"(?:^| ){name}=(\S+)", line)
                return found.group(1) if found else None
        return None

    def transcript(self) -> str:
        return f"--- stdout of {self.name}\n{self.stdout}\n--- stderr of {self.name}\n{self.stderr}"


class Procs:
    """Starts processes and kills whatever is still running at the end of the test."""

    def __init__(self) -> None:
        self.started: list[Proc] = []

    def manage(self, *args: str, env: dict[str, str], prefix: tuple[str, ...] = (), name: str = "") -> Proc:
        return self.start([*prefix, sys.executable, str(ROOT / "manage.py"), *args], env=env, name=name)

    def start(self, argv: list[str], *, env: dict[str, str], name: str = "") -> Proc:
        proc = Proc(argv, env=env, name=name)
        self.started.append(proc)
        return proc

    def kill_all(self) -> None:
        for proc in self.started:
            proc.kill()


def wait_until(
    check: Callable[[], object], *, timeout: float, interval: float = 0.1, what: str = ""
) -> object:
    """Poll ``check`` until it returns something truthy; at most ``timeout`` seconds."""
    deadline = time.monotonic() + timeout
    for _attempt in range(int(timeout / interval) + 2):
        value = check()
        if value:
            return value
        if time.monotonic() >= deadline:
            break
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout:g} s waiting for {what or check}")


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


class Gate:
    """A stand-in hook that holds the first request until the test opens the gate.

    That fetch then lasts exactly as long as the fault needs, never a guessed delay;
    later requests pass. ``limit`` bounds the hold in case the test never opens it.
    """

    def __init__(self, *, limit: float = 90) -> None:
        self.arrived: list[float] = []
        self.limit = limit
        self._open = threading.Event()
        self._lock = threading.Lock()

    def __call__(self) -> None:
        with self._lock:
            self.arrived.append(time.monotonic())
            first = len(self.arrived) == 1
        if first:
            self._open.wait(self.limit)

    def open(self) -> None:
        self._open.set()


@dataclass
class SilentServer:
    """Accepts TCP connections and never says a word: a hung database server."""

    host: str = "127.0.0.1"

    def __post_init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind((self.host, 0))
        self.sock.listen(16)
        self.sock.settimeout(0.2)
        self.port = self.sock.getsockname()[1]
        self.accepted: list[socket.socket] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._accept, daemon=True)
        self._thread.start()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _address = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            self.accepted.append(conn)  # held open, never read, never answered

    def close(self) -> None:
        self._stop.set()
        self._thread.join(timeout=2)
        for conn in self.accepted:
            conn.close()
        self.sock.close()
