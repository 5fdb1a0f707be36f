"""A loopback TCP proxy in front of PostgreSQL that can make the outcome of a COMMIT unknown.

    proxy = PgProxy(("127.0.0.1", 5432)).start()      # clients connect to proxy.port
    proxy.cut_commits(marker=b"committed_token", mode="after")   # the next such COMMIT only

``mode="after"``: the COMMIT of a transaction that sent a statement containing ``marker``
before any WHERE (a write that sets it, not one that only matches on it) reaches the server,
the server commits and answers, and the answer is dropped with both connections: the client
sees a dead connection although its write committed. ``mode="before"``:
the COMMIT itself is dropped with both connections, so the server rolls the transaction back.
Every other byte passes untouched, and later connections pass as usual. ``disarm()`` drops the
cuts planned and not made yet.

``PgProxy(target, watch=marker)`` also times every transaction that sent a statement containing
``marker`` (before any WHERE, as above): ``proxy.commits`` lists, for each one the server
committed, when that statement went to the server and when the server's answer to its COMMIT
came back (``time.time()``), whether or not the answer was then dropped.

It reads just enough of the frontend protocol to find statements: the untyped startup
messages (SSLRequest and GSSENCRequest are answered by the server with one byte), then typed
messages, where a simple query ('Q') and a Parse ('P') carry the SQL text. Bounded: every
socket has a timeout, and the proxy closes everything when stopped.
"""

from __future__ import annotations

import contextlib
import socket
import struct
import threading
import time
from dataclasses import dataclass

UNTYPED_REQUESTS = {80877103, 80877104}  # SSLRequest, GSSENCRequest: answered with one byte
ANSWER_TIMEOUT = 10.0
# The server's CommandComplete message for a COMMIT that committed ("ROLLBACK" when it did not).
COMMITTED = b"C\x00\x00\x00\x0bCOMMIT\x00"


@dataclass(frozen=True)
class Commit:
    """A watched transaction the server committed."""

    sent: float  # time.time() when its statement containing the marker went to the server
    committed: float  # when the server's answer to its COMMIT reached the proxy
    statement: bytes


class PgProxy:
    def __init__(
        self, target: tuple[str, int], *, host: str = "127.0.0.1", watch: bytes | None = None
    ) -> None:
        self.target = target
        self.watch = watch
        self.commits: list[Commit] = []
        self.listener = socket.create_server((host, 0))
        self.listener.settimeout(0.2)
        self.port = self.listener.getsockname()[1]
        self.cut = 0  # COMMITs cut so far
        self._plan: list[tuple[bytes, str]] = []
        self.dropping: bytes | None = None  # a connection that sends a statement holding it is cut
        self.dropped = 0
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._sockets: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True, name="pgproxy")

    def start(self) -> PgProxy:
        self._thread.start()
        return self

    def cut_commits(self, *, marker: bytes, mode: str = "after", times: int = 1) -> None:
        if mode not in {"after", "before"}:
            raise ValueError(f"mode must be 'after' or 'before', not {mode!r}")
        with self._lock:
            self._plan.extend([(marker, mode)] * times)

    def drop_statements(self, marker: bytes | None) -> None:
        """Cut every connection, at once, that sends a statement containing ``marker`` (None: stop):
        to the client, the database is unreachable for that statement."""
        with self._lock:
            self.dropping = marker

    def disarm(self) -> int:
        """Drop the cuts planned and not made yet; how many there were."""
        with self._lock:
            dropped = len(self._plan)
            self._plan.clear()
        return dropped

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=5)
        with self._lock:
            for sock in self._sockets:
                with contextlib.suppress(OSError):
                    sock.close()
        self.listener.close()

    def _take(self, statements: list[bytes]) -> str | None:
        """The mode of the next planned cut if one of ``statements`` has its marker."""
        with self._lock:
            for index, (marker, mode) in enumerate(self._plan):
                if any(sets(marker, statement) for statement in statements):
                    del self._plan[index]
                    self.cut += 1
                    return mode
        return None

    def _accept(self) -> None:
        while not self._stop.is_set():
            try:
                client, _address = self.listener.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            try:
                server = socket.create_connection(self.target, timeout=5)
            except OSError:
                client.close()
                continue
            with self._lock:
                self._sockets.extend([client, server])
            _Link(self, client, server).start()


class _Link:
    """One client connection and its server connection."""

    def __init__(self, proxy: PgProxy, client: socket.socket, server: socket.socket) -> None:
        self.proxy = proxy
        self.client = client
        self.server = server
        self.losing = threading.Event()  # the COMMIT went to the server: drop its answer
        self.awaiting: list[tuple[float, bytes]] = []  # watched transactions whose COMMIT was sent
        self.closed = threading.Event()
        for sock in (client, server):
            sock.settimeout(1.0)

    def start(self) -> None:
        threading.Thread(target=self._frontend, daemon=True).start()
        threading.Thread(target=self._backend, daemon=True).start()

    def close(self) -> None:
        self.closed.set()
        for sock in (self.client, self.server):
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
            with contextlib.suppress(OSError):
                sock.close()

    def _recv(self, sock: socket.socket) -> bytes | None:
        """Some bytes, b"" at the end, None when nothing came within the timeout."""
        try:
            return sock.recv(65536)
        except TimeoutError:
            return None
        except OSError:
            return b""

    def _frontend(self) -> None:
        """Client to server, one whole message at a time."""
        buffer = b""
        started = False  # past the StartupMessage: every message has a type byte
        transaction: list[bytes] = []  # statements since the last COMMIT or ROLLBACK
        watched: tuple[float, bytes] | None = None  # when this transaction sent the watched statement
        while not self.closed.is_set() and not self.proxy._stop.is_set():
            data = self._recv(self.client)
            if data is None:
                continue
            if not data:
                return self.close()
            buffer += data
            while True:
                if not started:
                    if len(buffer) < 8:
                        break
                    (length,) = struct.unpack("!I", buffer[:4])
                    if len(buffer) < length:
                        break
                    message, buffer = buffer[:length], buffer[length:]
                    (code,) = struct.unpack("!I", message[4:8])
                    started = code not in UNTYPED_REQUESTS
                    self._send(self.server, message)
                    continue
                if len(buffer) < 5:
                    break
                (length,) = struct.unpack("!I", buffer[1:5])
                if len(buffer) < 1 + length:
                    break
                message, buffer = buffer[: 1 + length], buffer[1 + length :]
                statement = _statement(message)
                if statement is None:
                    self._send(self.server, message)
                    continue
                if self.proxy.dropping is not None and self.proxy.dropping in statement:
                    with self.proxy._lock:
                        self.proxy.dropped += 1
                    return self.close()
                word = statement.strip().rstrip(b";").strip().upper()
                if word in {b"COMMIT", b"ROLLBACK", b"END", b"ABORT"}:
                    mode = self.proxy._take(transaction) if word in {b"COMMIT", b"END"} else None
                    if watched is not None and word in {b"COMMIT", b"END"} and mode != "before":
                        self.awaiting.append(watched)
                    transaction, watched = [], None
                    if mode == "before":
                        return self.close()
                    if mode == "after":
                        self.losing.set()
                else:
                    transaction.append(statement)
                    if watched is None and self.proxy.watch is not None and sets(self.proxy.watch, statement):
                        watched = (time.time(), statement)
                self._send(self.server, message)

    def _backend(self) -> None:
        """Server to client; once ``losing``, the COMMIT's answer is read and dropped."""
        answer = b""
        deadline = None
        while not self.closed.is_set() and not self.proxy._stop.is_set():
            data = self._recv(self.server)
            if data == b"":
                return self.close()
            if data and self.awaiting and COMMITTED in data:
                sent, statement = self.awaiting.pop(0)
                self.proxy.commits.append(Commit(sent, time.time(), statement))
            if self.losing.is_set():
                deadline = deadline or time.monotonic() + ANSWER_TIMEOUT
                answer += data or b""
                # CommandComplete "COMMIT", then ReadyForQuery: the server has committed.
                if b"COMMIT\x00" in answer or time.monotonic() > deadline:
                    return self.close()
                continue
            if data:
                self._send(self.client, data)

    def _send(self, sock: socket.socket, data: bytes) -> None:
        try:
            sock.sendall(data)
        except OSError:
            self.close()


def sets(marker: bytes, statement: bytes) -> bool:
    """Whether ``marker`` is in ``statement`` before its WHERE: an UPDATE that sets the column
    it names, not one that only matches on it (a success's release, rule 15)."""
    return marker in statement.split(b" WHERE ", 1)[0]


def _statement(message: bytes) -> bytes | None:
    """The SQL text of a simple query ('Q') or a Parse ('P') message, else None."""
    kind, body = message[:1], message[5:]
    if kind == b"Q":
        return body.rstrip(b"\x00")
    if kind == b"P":
        _name, _, rest = body.partition(b"\x00")
        return rest.partition(b"\x00")[0]
    return None
