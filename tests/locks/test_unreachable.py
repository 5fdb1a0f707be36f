"""Lock semantic 8: an unreachable database skips the tick with one WARNING line.

One test for every way a run meets it (it stood three times over: ``sync_contests``,
``sync_contests --tick`` and ``run_job record --tick``): the same lock code skips whatever
the job, so the host project's job stands for them all. MongoDB's own case, a cluster
that cannot be selected, is tests/test_mongodb_settings.py's.
"""

import socket
import time

import pytest

from tests.conftest import manage, project_env

pytestmark = pytest.mark.slow
TICK = "2026-11-30T14:00:00+00:00"


def _closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.mark.parametrize(
    "url",
    [
        pytest.param(f"postgres://nobody@127.0.0.1:{_closed_port()}/contests", id="postgres-closed-port"),
        pytest.param("sqlite:////nonexistent-directory/for/db.sqlite3", id="sqlite-missing-directory"),
    ],
)
@pytest.mark.parametrize("tick", [[], ["--tick", TICK]], ids=["current-tick", "given-tick"])
def test_database_unreachable_skips_the_tick_with_one_warning(url, tick):
    started = time.monotonic()
    proc = manage("run_job", "write_slot", *tick, env=project_env(DATABASE_URL=url))
    elapsed = time.monotonic() - started

    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    warnings = [line for line in proc.stderr.splitlines() if " WARNING " in line]
    assert len(warnings) == 1, proc.stderr
    assert "job=write_slot tick=" in warnings[0]
    if tick:
        assert f"job=write_slot tick={TICK} " in warnings[0]
    assert "outcome=skipped reason=database unreachable: OperationalError:" in warnings[0]
    assert " ERROR " not in proc.stderr
    assert elapsed < 15  # hang guard: the connect timeout is 5 s


def test_a_database_without_tables_is_an_error_that_says_migrate(tmp_path):
    proc = manage(
        "run_job", "write_slot", env=project_env(DATABASE_URL=f"sqlite:///{tmp_path / 'empty.sqlite3'}")
    )

    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert "the lock table is missing" in proc.stderr
    assert "run `python manage.py migrate`" in proc.stderr


@pytest.mark.parametrize("args", [["status"], ["release", "write_slot"]])
def test_locks_command_on_an_unreachable_database_is_a_clear_error(args):
    url = f"postgres://nobody@127.0.0.1:{_closed_port()}/contests"
    proc = manage("locks", *args, env=project_env(DATABASE_URL=url))

    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr
    assert proc.stderr.startswith("CommandError: cannot read the locks: connection failed:")
