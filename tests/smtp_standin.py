"""A minimal local SMTP server for tests: accepts messages, refuses chosen recipients.

Speaks just enough of RFC 5321 for ``smtplib`` (EHLO/HELO, MAIL, RCPT, DATA, RSET,
NOOP, QUIT), without TLS or authentication. What it accepted is in ``messages``
(``email.message.Message`` objects).
"""

from __future__ import annotations

import email
import socketserver
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from email.message import Message


class SmtpStandin:
    def __init__(self) -> None:
        self.refused: set[str] = set()  # recipient addresses answered with 550
        self.messages: list[Message] = []
        self.sessions = 0  # connections accepted
        self.lock = threading.Lock()
        self.port = 0


def _handler(standin: SmtpStandin) -> type[socketserver.StreamRequestHandler]:
    class Handler(socketserver.StreamRequestHandler):
        def reply(self, line: str) -> None:
            self.wfile.write(line.encode() + b"\r\n")

        def handle(self) -> None:
            with standin.lock:
                standin.sessions += 1
            self.reply("220 standin ESMTP")
            while line := self.rfile.readline():
                command = line.decode(errors="replace").strip()
                verb = command[:4].upper()
                if verb in {"EHLO", "HELO"}:
                    self.reply("250 standin")
                elif verb == "RCPT":
                    address = command.split(":", 1)[1].strip().strip("<>")
                    refused = address in standin.refused
                    self.reply(f"550 5.1.1 <{address}>: no such user" if refused else "250 OK")
                elif verb == "DATA":
                    self.reply("354 end with .")
                    data = []
                    while (chunk := self.rfile.readline()) not in {b".\r\n", b""}:
                        data.append(chunk[1:] if chunk.startswith(b"..") else chunk)
                    with standin.lock:
                        standin.messages.append(email.message_from_bytes(b"".join(data)))
                    self.reply("250 OK queued")
                elif verb == "QUIT":
                    self.reply("221 bye")
                    return
                else:  # MAIL, RSET, NOOP
                    self.reply("250 OK")

    return Handler


@contextmanager
def smtp_standin() -> Iterator[SmtpStandin]:
    standin = SmtpStandin()
    server = socketserver.ThreadingTCPServer(("127.0.0.1", 0), _handler(standin))
    server.daemon_threads = True
    standin.port = server.server_address[1]
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield standin
    finally:
        server.shutdown()
        server.server_close()
