"""A redirect from the Codeforces URL is never followed: the sync fails cleanly, nothing written."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from contests.codeforces import CodeforcesClient, CodeforcesError
from contests.models import Contest
from locks.models import JobRun
from tests.conftest import manage, project_env


@pytest.fixture
def redirector(standin) -> Iterator[str]:
    """A local server that answers every request with a 302 to the stand-in, which
    serves the real contest list: following the redirect would store 1,758 contests."""
    target = f"{standin.url}/contest.list?gym=false"

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            self.send_response(302)
            self.send_header("Location", target)
            self.send_header("Content-Length", "0")
            self.end_headers()

        def log_message(self, format: str, *args) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    server.daemon_threads = True
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        yield f"http://127.0.0.1:{server.server_port}/api"
    finally:
        server.shutdown()
        server.server_close()


def test_the_client_refuses_a_redirect_and_names_its_target(redirector, standin):
    with pytest.raises(CodeforcesError) as excinfo:
        CodeforcesClient(base_url=redirector, max_attempts=1).contest_list()

    message = str(excinfo.value)
    assert f"Codeforces API at {redirector}/contest.list answered HTTP 302 redirecting to " in message
    assert f"'{standin.url}/contest.list?gym=false'" in message
    assert "redirects are not followed" in message
    assert standin.calls == 0


def test_the_sync_fails_with_exit_1_and_writes_no_contest(redirector, standin, db_url):
    env = project_env(DATABASE_URL=db_url, CODEFORCES_API_URL=redirector, CODEFORCES_MAX_ATTEMPTS="1")

    proc = manage("sync_contests", "--force", env=env)

    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    [error] = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert "outcome=failed" in error
    assert "answered HTTP 302 redirecting to" in error
    assert standin.calls == 0
    assert not Contest.objects.exists()
    assert JobRun.objects.get().status == "failed"
