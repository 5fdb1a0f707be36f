"""A local stand-in for the Codeforces API, for tests and the demo.

Serves ``/api/contest.list`` from the bundled real response (or any payload),
counts requests, and can misbehave on demand: HTTP errors, ``FAILED`` answers,
slowness, a body trickled byte by byte, truncated or oversized bodies.

    python -m tests.standin --port 8765 [--delay 0] [--trickle 0] [--host 127.0.0.1]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import threading
import time
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

FIXTURE = Path(__file__).resolve().parent / "fixtures" / "codeforces-contest-list-2023-07.json"


def load_fixture() -> dict:
    return json.loads(FIXTURE.read_text())


class Standin:
    """Behaviour is plain attributes, changeable while the server runs."""

    def __init__(self, payload: dict | bytes | None = None) -> None:
        self.body: bytes = b""
        self.set_payload(payload if payload is not None else load_fixture())
        self.status = 200
        self.delay = 0.0
        # Seconds between bytes of the body (0: all at once): the headers come at
        # once, then one byte per ``trickle`` seconds, for at most ``trickle_for``
        # seconds, after which the connection is closed.
        self.trickle = 0.0
        self.trickle_for = 60.0
        self.trickled = 0  # body bytes sent that way
        self.response_headers: dict[str, str] = {}  # added to every answer
        # Responses to give before the normal one: (status, body) pairs.
        self.queue: list[tuple[int, bytes]] = []
        self.hook: Callable[[], None] | None = None
        self.requests: list[str] = []
        self.headers: list[dict[str, str]] = []
        self.lock = threading.Lock()

    def set_payload(self, payload: dict | bytes) -> None:
        self.body = payload if isinstance(payload, bytes) else json.dumps(payload).encode()

    @property
    def calls(self) -> int:
        return sum(1 for path in self.requests if "contest.list" in path)


def make_handler(standin: Standin) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def do_GET(self) -> None:
            with standin.lock:
                standin.requests.append(self.path)
                standin.headers.append(dict(self.headers))
                queued = standin.queue.pop(0) if standin.queue else None
            if standin.hook:
                standin.hook()
            if standin.delay:
                time.sleep(standin.delay)
            if not self.path.startswith("/api/contest.list"):
                self._send(404, b'{"status":"FAILED","comment":"method not found"}')
                return
            status, body = queued or (standin.status, standin.body)
            self._send(status, body)

        def _send(self, status: int, body: bytes) -> None:
            try:
                self.send_response(status)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                for name, value in standin.response_headers.items():
                    self.send_header(name, value)
                self.end_headers()
                if standin.trickle:
                    self._trickle(body)
                else:
                    self.wfile.write(body)
            except (BrokenPipeError, ConnectionResetError):
                pass

        def _trickle(self, body: bytes) -> None:
            ends = time.monotonic() + standin.trickle_for
            for index in range(len(body)):
                if time.monotonic() >= ends:
                    break
                self.wfile.write(body[index : index + 1])
                self.wfile.flush()
                with standin.lock:
                    standin.trickled += 1
                time.sleep(standin.trickle)
            self.close_connection = True

        def log_message(self, format: str, *args) -> None:
            pass

    return Handler


def serve(standin: Standin, *, host: str = "127.0.0.1", port: int = 0) -> ThreadingHTTPServer:
    server = ThreadingHTTPServer((host, port), make_handler(standin))
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8765)
    parser.add_argument("--delay", type=float, default=0.0, help="Seconds before each answer.")
    parser.add_argument("--trickle", type=float, default=0.0, help="Seconds between bytes of each body.")
    parser.add_argument("--count-file", help="Write the number of contest.list calls here on each call.")
    args = parser.parse_args()
    standin = Standin()
    standin.delay = args.delay
    standin.trickle = args.trickle
    if args.count_file:
        count_file = Path(args.count_file)

        def record() -> None:
            count_file.write_text(str(standin.calls))

        standin.hook = record
    server = ThreadingHTTPServer((args.host, args.port), make_handler(standin))
    server.daemon_threads = True
    print(f"Codeforces stand-in on http://{args.host}:{server.server_port}/api", flush=True)
    with contextlib.suppress(KeyboardInterrupt):
        server.serve_forever()


if __name__ == "__main__":
    main()
