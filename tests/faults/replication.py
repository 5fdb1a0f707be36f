"""Two real PostgreSQL clusters for the failover tests: a primary, a ``pg_basebackup -R`` standby
fed through a replication-link relay that can freeze, and an application relay that is switched
to the promoted standby (docs/faults.md, "Failover").

    primary (initdb)  <-- link relay (freeze/thaw) --  standby (pg_basebackup -R, hot standby)
          ^                                                   ^
          +------------ app relay (switch) -------------------+  <-- the copies' DATABASE_URL

A frozen relay stops reading from both sockets: nothing more crosses the link, in either direction,
until it thaws, and what it read but had not sent yet waits with it (stopping it drops that). That
is a network that stops delivering, unlike a SIGSTOP of the walreceiver, which lets the bytes
already in its socket buffer through when it resumes.

Everything listens on 127.0.0.1 only. As root, the servers run as the ``postgres`` user. Every
wait is bounded; ``Pair.destroy()`` stops both servers and deletes their directories.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import socket
import subprocess
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

from tests.faults.support import free_port

PG_BIN = Path(os.environ.get("WITH_POSTGRES_BIN", "/usr/lib/postgresql/15/bin"))
DATABASE = "contests"


def unavailable_reason() -> str | None:
    """Why two clusters cannot be made here, or None when they can."""
    for tool in ("initdb", "pg_ctl", "pg_basebackup"):
        if not (PG_BIN / tool).exists():
            return f"the PostgreSQL server binaries ({PG_BIN / tool}) are not installed"
    if os.geteuid() != 0:
        return "the failover tests make two PostgreSQL clusters as the postgres user: they need root"
    return None


def _runas() -> str:
    return "postgres" if os.geteuid() == 0 else ""


def _run(*argv: str, timeout: float = 60) -> subprocess.CompletedProcess:
    if _runas():
        argv = ("runuser", "-u", _runas(), "--", *argv)
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout)
    if done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)} failed ({done.returncode}): {done.stderr or done.stdout}")
    return done


def workdir() -> Path:
    """A directory the server's user may write, removed by the caller."""
    path = Path(tempfile.mkdtemp(prefix="failover-"))
    path.chmod(0o755)
    if _runas():
        shutil.chown(path, _runas())
    return path


@dataclass
class Cluster:
    data: Path
    port: int

    @property
    def log(self) -> Path:
        return self.data.with_suffix(".log")

    def conf(self, text: str) -> None:
        with (self.data / "postgresql.auto.conf").open("a") as conf:
            conf.write(f"\n{text}\n")

    def start(self) -> None:
        _run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-w", "-t", "30", "start")

    def stop(self, mode: str = "fast") -> None:
        """``immediate``: the server dies at once, as in a crash (no shutdown checkpoint)."""
        if (self.data / "postmaster.pid").exists():
            _run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-m", mode, "-w", "-t", "30", "stop")

    def promote(self) -> None:
        _run(str(PG_BIN / "pg_ctl"), "-D", str(self.data), "-w", "-t", "30", "promote")

    def connect(self, **options) -> psycopg.Connection:
        return psycopg.connect(
            host="127.0.0.1", port=self.port, user="postgres", dbname=DATABASE, connect_timeout=5, **options
        )

    def query(self, sql: str, params: tuple = ()) -> list[tuple]:
        with self.connect(autocommit=True) as conn:
            cursor = conn.execute(sql, params)
            return cursor.fetchall() if cursor.description is not None else []

    def one(self, sql: str, params: tuple = ()) -> object:
        rows = self.query(sql, params)
        return rows[0][0] if rows else None


def make_template(root: Path, *, migrate) -> Path:
    """A stopped primary's data directory with the project's tables: ``initdb``, a database,
    ``migrate(url)``. Copied for each test (a copy takes a fraction of a second, a migrate seconds)."""
    data = root / "template"
    _run(str(PG_BIN / "initdb"), "-D", str(data), "-A", "trust", "-U", "postgres", "-E", "UTF8",
         "--locale=C.UTF-8")  # fmt: skip
    cluster = Cluster(data, free_port())
    cluster.conf(
        f"listen_addresses = '127.0.0.1'\nport = {cluster.port}\nunix_socket_directories = '{root}'\n"
        "fsync = off\nfull_page_writes = off\nwal_keep_size = '64MB'\nmax_connections = 60\n"
        "wal_receiver_status_interval = 1\nhot_standby_feedback = off\nlog_min_messages = warning"
    )
    cluster.start()
    try:
        with psycopg.connect(host="127.0.0.1", port=cluster.port, user="postgres", dbname="postgres",
                             autocommit=True) as conn:  # fmt: skip
            conn.execute(f"CREATE DATABASE {DATABASE}")
        migrate(f"postgres://postgres@127.0.0.1:{cluster.port}/{DATABASE}")
    finally:
        cluster.stop()
    (data / "postmaster.opts").unlink(missing_ok=True)
    return data


class Relay:
    """A TCP relay on 127.0.0.1 to ``target`` (a port on 127.0.0.1) that can freeze (hold every
    byte, both ways) and be switched to another target (its connections cut, as when a virtual IP
    moves)."""

    def __init__(self, target: int, *, name: str) -> None:
        self.target = target
        self.name = name
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self._flowing = threading.Event()
        self._flowing.set()
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._pairs: list[tuple[socket.socket, socket.socket]] = []
        self._thread = threading.Thread(target=self._accept, daemon=True, name=f"relay-{name}")
        self._thread.start()

    def freeze(self) -> None:
        self._flowing.clear()

    def thaw(self) -> None:
        self._flowing.set()

    def switch(self, target: int) -> None:
        """New connections go to ``target``; the open ones are cut."""
        self.target = target
        self.cut()

    def cut(self) -> None:
        with self._lock:
            pairs, self._pairs = self._pairs, []
        for pair in pairs:
            for sock in pair:
                with contextlib.suppress(OSError):
                    sock.shutdown(socket.SHUT_RDWR)
                with contextlib.suppress(OSError):
                    sock.close()

    def stop(self) -> None:
        """Close everything; bytes a frozen relay holds are dropped, never delivered."""
        self._stop.set()
        self._thread.join(timeout=5)
        self.cut()
        self.listener.close()

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _address = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(("127.0.0.1", self.target), timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._pairs.append((client, server))
            for source, sink in ((client, server), (server, client)):
                source.settimeout(0.2)
                threading.Thread(target=self._pump, args=(source, sink), daemon=True).start()

    def _pump(self, source: socket.socket, sink: socket.socket) -> None:
        while not self._stop.is_set():
            if not self._flowing.wait(0.2):
                continue  # frozen: leave the bytes where they are
            try:
                data = source.recv(65536)
            except TimeoutError:
                continue
            except OSError:
                data = b""
            if not data:
                break
            while not self._flowing.wait(0.2) and not self._stop.is_set():
                pass  # frozen while holding bytes: they wait too
            if self._stop.is_set():
                break  # stopped: what it holds is dropped
            try:
                sink.sendall(data)
            except OSError:
                break
        for sock in (source, sink):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)


@dataclass
class Pair:
    """A primary and its standby, the link relay between them and the app relay in front."""

    root: Path
    primary: Cluster
    standby: Cluster
    link: Relay
    app: Relay
    relays: list[Relay] = field(default_factory=list)

    synchronous: bool = False
    standbys: int = 1  # standbys built so far: each gets a directory of its own

    @classmethod
    def create(cls, template: Path, *, synchronous: bool = False, conf: str = "") -> Pair:
        """``conf``: more settings for the primary (the standbys copy them with its data)."""
        root = workdir()
        data = root / "primary"
        _run("cp", "-a", str(template), str(data))
        primary = Cluster(data, free_port())
        primary.conf(f"port = {primary.port}\nunix_socket_directories = '{root}'\n{conf}")
        if synchronous:
            primary.conf("synchronous_standby_names = '*'\nsynchronous_commit = on")
        primary.start()
        link = Relay(primary.port, name="link")
        standby = Cluster(root / "standby", free_port())
        pair = cls(root, primary, standby, link, Relay(primary.port, name="app"), synchronous=synchronous)
        try:
            pair._build_standby()
        except BaseException:
            pair.destroy()
            raise
        return pair

    def _build_standby(self) -> None:
        """``pg_basebackup -R`` of the primary through the link relay into the standby's directory,
        started as a hot standby (asynchronous itself: it has no standby of its own), streaming."""
        _run(str(PG_BIN / "pg_basebackup"), "-h", "127.0.0.1", "-p", str(self.link.port), "-U", "postgres",
             "-D", str(self.standby.data), "-R", "-X", "stream", "-c", "fast")  # fmt: skip
        self.standby.conf(
            f"port = {self.standby.port}\nunix_socket_directories = '{self.root}'\nsynchronous_standby_names = ''"
        )
        self.standby.start()
        self.wait_streaming()

    @property
    def url(self) -> str:
        """The copies' DATABASE_URL: through the app relay."""
        return f"postgres://postgres@127.0.0.1:{self.app.port}/{DATABASE}"

    def wait_streaming(self, *, timeout: float = 20) -> None:
        self._wait_for(
            "SELECT count(*) FROM pg_stat_replication WHERE state = 'streaming'", "start streaming", timeout
        )

    def wait_synchronous(self, *, timeout: float = 20) -> None:
        """Until the primary counts its standby as synchronous (its commits wait for it)."""
        self._wait_for(
            "SELECT count(*) FROM pg_stat_replication WHERE sync_state = 'sync'",
            "become synchronous",
            timeout,
        )

    def _wait_for(self, query: str, what: str, timeout: float) -> None:
        """Until the primary answers ``query`` with a count above 0, within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(psycopg.Error):
                if self.primary.one(query):
                    return
            time.sleep(0.1)
        raise AssertionError(f"the standby did not {what} within {timeout:g} s")

    def wait_replayed(self, *, timeout: float = 20) -> None:
        """Until the standby has replayed everything the primary has written so far."""
        target = self.primary.one("SELECT pg_current_wal_lsn()::text")
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with contextlib.suppress(psycopg.Error):
                if self.standby.one("SELECT pg_last_wal_replay_lsn() >= %s::pg_lsn", (target,)):
                    return
            time.sleep(0.05)
        raise AssertionError(f"the standby did not replay up to {target} within {timeout:g} s")

    def fail_over(self) -> None:
        """The primary dies at once, the standby is promoted, the app relay points at it."""
        self.primary.stop("immediate")
        self.link.stop()
        self.standby.promote()
        self.app.switch(self.standby.port)

    def rebuild(self, *, timeout: float = 30) -> None:
        """After ``fail_over()``: the promoted standby is the primary, the old primary's directory
        goes, and a fresh standby is built from the new primary through a new link relay, so that the
        next failover can happen. Synchronous: once it streams, the new primary waits for it (as
        Patroni's ``synchronous_mode`` does: not before it exists, or every commit would wait)."""
        old, self.primary = self.primary, self.standby
        with contextlib.suppress(Exception):
            old.stop("immediate")
        shutil.rmtree(old.data, ignore_errors=True)
        old.log.unlink(missing_ok=True)
        self.standbys += 1
        self.standby = Cluster(self.root / f"standby{self.standbys}", free_port())
        self.link = Relay(self.primary.port, name="link")
        self._build_standby()
        if self.synchronous:
            self.primary.conf("synchronous_standby_names = '*'\nsynchronous_commit = on")
            self.primary.one("SELECT pg_reload_conf()")
            self.wait_synchronous(timeout=timeout)

    def lag(self) -> int:
        """Bytes of WAL the primary wrote that the standby has not replayed (what a failover now loses)."""
        written = self.primary.one("SELECT pg_current_wal_lsn()::text")
        behind = self.standby.one("SELECT pg_wal_lsn_diff(%s::pg_lsn, pg_last_wal_replay_lsn())", (written,))
        return max(int(behind), 0)  # read after the primary's: the standby may have replayed more since

    def destroy(self) -> None:
        for relay in (self.app, self.link):
            with contextlib.suppress(Exception):
                relay.stop()
        for cluster in (self.standby, self.primary):
            with contextlib.suppress(Exception):
                cluster.stop("immediate")
        shutil.rmtree(self.root, ignore_errors=True)
