"""The documented gunicorn command survives slow clients (issue 21, item 7): with
2 x workers connections that never finish their request, /healthz still answers."""

from __future__ import annotations

import secrets
import socket
import sys
from pathlib import Path

import pytest
import requests

from tests.conftest import ROOT, gunicorn
from tests.test_deploy_settings import production_env

# docs/deployment.md, "Serving the admin and the endpoints", word for word.
DOCUMENTED = "gunicorn -c config/gunicorn.py config.wsgi"
WORKERS = 3  # config/gunicorn.py's default (WEB_CONCURRENCY unset)
HALF_SENT = b"GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slow"  # no end of headers
pytestmark = pytest.mark.slow


def test_the_command_is_the_documented_one():
    assert f"\n{DOCUMENTED}\n" in (ROOT / "docs" / "deployment.md").read_text()


def test_healthz_answers_while_twice_as_many_clients_as_workers_send_slowly(db_url, tmp_path):
    env = production_env(
        DATABASE_URL=db_url, DJANGO_ALLOWED_HOSTS="127.0.0.1", LOCKS_HEALTHZ_TOKEN=secrets.token_urlsafe(32)
    )
    env.pop("WEB_CONCURRENCY", None)
    env.pop("GUNICORN_THREADS", None)
    command = DOCUMENTED.split()
    command[0] = str(Path(sys.executable).with_name("gunicorn"))
    log = tmp_path / "gunicorn.log"
    slow: list[socket.socket] = []
    with gunicorn(env=env, log=log, command=command) as base:
        try:
            assert requests.get(base + "/healthz", timeout=60).status_code == 503  # up; never synced
            for _ in range(2 * WORKERS):
                client = socket.create_connection(("127.0.0.1", int(base.rsplit(":", 1)[1])), timeout=10)
                client.sendall(HALF_SENT)
                slow.append(client)
            # Each slow client holds a thread; with sync workers each would hold a worker.
            answers = [requests.get(base + "/healthz", timeout=10) for _ in range(2 * WORKERS)]
        finally:
            for client in slow:
                client.close()
    assert [answer.status_code for answer in answers] == [503] * (2 * WORKERS)
    assert all(answer.json()["status"] == "stale" for answer in answers)
    output = log.read_text()
    assert "Booting worker" in output and "gthread" in output, output
    assert "Traceback" not in output
