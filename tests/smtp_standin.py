"""A local SMTP server for tests and benchmarks: accepts messages, or misbehaves on cue.

Speaks just enough of RFC 5321 for ``smtplib`` (EHLO/HELO, MAIL, RCPT, DATA, RSET, NOOP,
QUIT, and STARTTLS when given a TLS context), optionally over implicit TLS. Behaviours,
each chosen per recipient address (or per session for ``drop_after``):

- ``refused``: 550 to RCPT;
- ``data_command_reply`` / ``data_reply``: this reply (a "4xx …" or "5xx …" line) to the
  DATA command, or after the message's content instead of 250;
- ``late``: the 250 after the content is held back until the client hangs up (at most
  ``late_bound`` seconds), so it comes later than any client timeout shorter than that;
- ``drop_after_data``: the connection is closed once the content has arrived, no reply;
- ``drop_after``: the connection is closed after that many messages of one session (of the
  sessions numbered in ``drop_sessions``, when set: 1 is the first to connect);
- ``lose_reply`` (every recipient, while set; the soak's ``smtp-lost-reply``): ``"late"``
  holds every 250 back as ``late`` does, ``"drop"`` closes the connection after the
  content as ``drop_after_data`` does;
- ``reply_delay``: seconds before each 250 (a mail server's latency).

``received`` counts, per recipient, every message whose content arrived in full (what a
user might get); ``accepted`` those answered 250, and ``per_session`` per connection. With ``keep=True`` the messages are kept
(``email.message.Message``) in ``messages``, and ``arrivals`` says when each one's content
arrived and whether its 250 was sent; the benchmark turns that off: it only counts.
Every wait is bounded: a silent client is dropped after ``idle_timeout`` seconds.
"""

from __future__ import annotations

import email
import select
import socket
import socketserver
import ssl
import subprocess
import threading
import time
from collections import Counter
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from email.message import Message
from pathlib import Path


@dataclass
class Arrival:
    """One message whose content arrived in full (kept with ``keep=True``)."""

    recipient: str
    message: Message
    at: float  # time.time() when its final "." arrived
    answered: bool = False  # its 250 was sent (false: refused, dropped, or held back until the client left)


class SmtpStandin:
    def __init__(self, *, keep: bool = True) -> None:
        self.keep = keep
        self.refused: set[str] = set()
        self.data_command_reply: dict[str, str] = {}
        self.data_reply: dict[str, str] = {}
        self.late: set[str] = set()
        self.late_bound = 30.0
        self.drop_after_data: set[str] = set()
        self.drop_after: int | None = None
        self.drop_sessions: set[int] | None = None  # None: every session
        self.lose_reply = ""  # "late" or "drop": for every recipient, while set
        self.reply_delay = 0.0
        self.messages: list[Message] = []
        self.arrivals: list[Arrival] = []
        self.received: Counter[str] = Counter()
        self.accepted: Counter[str] = Counter()
        self.sessions = 0  # connections accepted
        self.per_session: Counter[int] = Counter()  # session number (1, 2, …) -> messages it had accepted
        self.on_message = None  # called with the recipient after each accepted message
        self.tls: ssl.SSLContext | None = None  # offers STARTTLS with this context
        self.lock = threading.Lock()
        self.port = 0
        self.idle_timeout = 30.0

    def total(self) -> int:
        with self.lock:
            return sum(self.received.values())


class _Closed(Exception):
    pass


def _handler(standin: SmtpStandin, *, implicit_tls: ssl.SSLContext | None):
    class Handler(socketserver.StreamRequestHandler):
        timeout = standin.idle_timeout

        def setup(self) -> None:
            if implicit_tls is not None:
                self.request.settimeout(self.timeout)
                self.request = implicit_tls.wrap_socket(self.request, server_side=True)
            super().setup()

        def reply(self, line: str) -> None:
            self.connection.sendall(line.encode() + b"\r\n")

        def start_tls(self) -> None:
            self.reply("220 2.0.0 ready to start TLS")
            self.connection = standin.tls.wrap_socket(self.connection, server_side=True)
            self.rfile = self.connection.makefile("rb")
            self.secure = True

        def handle(self) -> None:
            with standin.lock:
                standin.sessions += 1
                self.session = standin.sessions
            self.secure = implicit_tls is not None
            self.delivered = 0
            self.reply("220 standin ESMTP")
            try:
                while line := self.rfile.readline():
                    self.command(line.decode(errors="replace").strip())
            except (_Closed, OSError):
                pass  # the client hung up, timed out, or a behaviour closed the connection

        def command(self, command: str) -> None:
            verb = command[:4].upper()
            if verb in {"EHLO", "HELO"}:
                self.recipient = ""
                if standin.tls is not None and not self.secure:
                    self.reply("250-standin")
                    self.reply("250 STARTTLS")
                else:
                    self.reply("250 standin")
            elif command.upper() == "STARTTLS" and standin.tls is not None and not self.secure:
                self.start_tls()
            elif verb == "RCPT":
                address = command.split(":", 1)[1].strip().strip("<>")
                if address in standin.refused:
                    self.reply(f"550 5.1.1 <{address}>: no such user")
                else:
                    self.recipient = address
                    self.reply("250 OK")
            elif verb == "DATA":
                self.data()
            elif verb == "QUIT":
                self.reply("221 bye")
                raise _Closed
            else:  # MAIL, RSET, NOOP
                self.reply("250 OK")

        def data(self) -> None:
            recipient = self.recipient
            if recipient in standin.data_command_reply:
                self.reply(standin.data_command_reply[recipient])
                return
            self.reply("354 end with .")
            chunks = []
            while (chunk := self.rfile.readline()) != b".\r\n":
                if not chunk:
                    raise _Closed
                if standin.keep:
                    chunks.append(chunk[1:] if chunk.startswith(b"..") else chunk)
            arrival = None
            with standin.lock:
                standin.received[recipient] += 1
                if standin.keep:
                    message = email.message_from_bytes(b"".join(chunks))
                    standin.messages.append(message)
                    arrival = Arrival(recipient, message, time.time())
                    standin.arrivals.append(arrival)
                lose = standin.lose_reply
            if recipient in standin.drop_after_data or lose == "drop":
                self.connection.shutdown(socket.SHUT_RDWR)
                raise _Closed
            if recipient in standin.late or lose == "late":
                self.hold_back()
            if recipient in standin.data_reply:
                self.reply(standin.data_reply[recipient])
                return
            if standin.on_message is not None:
                standin.on_message(recipient)  # before the 250: the client waits for it
            if standin.reply_delay:
                time.sleep(standin.reply_delay)
            self.reply("250 OK queued")
            with standin.lock:
                standin.accepted[recipient] += 1
                standin.per_session[self.session] += 1
                if arrival is not None:
                    arrival.answered = True
            self.delivered += 1
            dropping = standin.drop_sessions is None or self.session in standin.drop_sessions
            if standin.drop_after is not None and dropping and self.delivered >= standin.drop_after:
                self.connection.shutdown(socket.SHUT_RDWR)
                raise _Closed

        def hold_back(self) -> None:
            """Say nothing until the client gives up and hangs up (it sends nothing while
            it waits for the reply, so the socket turning readable means it closed), or
            until ``late_bound`` seconds have passed: then the 250 comes, late."""
            deadline = time.monotonic() + standin.late_bound
            while time.monotonic() < deadline:
                if select.select([self.connection], [], [], 0.05)[0]:
                    raise _Closed

    return Handler


@contextmanager
def smtp_standin(
    *, keep: bool = True, starttls: ssl.SSLContext | None = None, implicit_tls: ssl.SSLContext | None = None
) -> Iterator[SmtpStandin]:
    """Serve on a free loopback port (``standin.port``) until the block ends."""
    standin = SmtpStandin(keep=keep)
    standin.tls = starttls
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _handler(standin, implicit_tls=implicit_tls))
    server.daemon_threads = True
    standin.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield standin
    finally:
        server.shutdown()
        server.server_close()


def self_signed(directory: Path) -> tuple[ssl.SSLContext, Path]:
    """A certificate for 127.0.0.1, made with openssl in ``directory``: the server's TLS
    context, and the file a client is to trust (``SSL_CERT_FILE``)."""
    cert, key = directory / "smtp-cert.pem", directory / "smtp-key.pem"
    subprocess.run(
        [
            *("openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1"),
            *("-keyout", str(key), "-out", str(cert), "-subj", "/CN=127.0.0.1"),
            *("-addext", "subjectAltName=IP:127.0.0.1"),
        ],
        check=True,
        capture_output=True,
        timeout=60,
    )
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context, cert
