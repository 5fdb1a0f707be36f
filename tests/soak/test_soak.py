"""The short seeded soak of ``make test`` (``make test-soak``, about two minutes).

Three ``run_scheduler`` replicas running the soak job (``catch_up: "all"``: every slot must
run, none is excused) and ``send_reminders`` (``--reminders``: the SMTP stand-in, 150-odd
reminders due through the soak) under seed 7697's nemesis for 70 s: SIGKILL of the replica
whose ``send_reminders`` run is sending (its messages so far unrecorded, their claims expire
and later runs send them again: the re-sends ``reminder-once`` allows), PostgreSQL restarted
(``-m immediate``) in the middle of a run, a holder frozen (SIGSTOP) inside its fenced write for
17.6 s, and from just before the last slot 16.6 s of an SMTP server that keeps each message and
never answers 250; then three healthy slots and the checker (tests/soak/checker.py,
tests/soak/reminders.py). One soak, one test per check.

Before issue 17's fixes the frozen holder kept its row lock, contenders waited on it, its write
committed after its lease and the slots of its freeze were lost. Before the retried record of
contests/reminders.py (``_Group.record``) each database stop in the middle of a reminders run
re-sent what that run had sent: ``test_no_reminder_was_emailed_twice_beyond_the_documented_resends``
found 23 re-sends (seed 5496, whose two database stops this seed's restart stands for).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import sys

import pytest
from django.db import connection, connections

from tests.conftest import ROOT, project_env
from tests.faults.conftest import unavailable
from tests.faults.pg import PgServer
from tests.soak.checker import COMMIT_TOLERANCE
from tests.soak.nemesis import KINDS, plan
from tests.soak.timing import REMINDERS_PER_MINUTE, TTL

pytestmark = pytest.mark.slow

SEED, DURATION, REPLICAS = 7697, 70, 3
# Issue 17's "done when": the soak passes with catch_up "all" for its job.
CATCH_UP = ["--catch-up", "all"]
RECORDS = ROOT / "var" / "soak" / "pytest"
# Setup (a database, migrations, three replicas), the nemesis, three healthy slots, the stops.
TIMEOUT = DURATION + 240


@pytest.fixture(scope="module")
def soak() -> dict:
    if connection.vendor != "postgresql":
        pytest.skip(
            "PostgreSQL only (the soak restarts and stops the server): `make test-soak` runs it on a cluster of its own"
        )
    if PgServer.from_environment() is None:
        unavailable(
            "the soak stops the PostgreSQL server: only one started by scripts/with-postgres.sh may be"
        )
    if shutil.which("faketime") is None:
        unavailable("faketime (Debian package faketime) is not installed")
    argv = [sys.executable, "-m", "tests.soak", "--seed", str(SEED), "--duration", str(DURATION)]
    argv += ["--replicas", str(REPLICAS), "--records", str(RECORDS), *CATCH_UP, "--reminders"]
    proc = subprocess.Popen(
        argv, cwd=ROOT, env=project_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )
    try:
        out, err = proc.communicate(timeout=TIMEOUT)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)  # the driver stops its replicas and drops its database
        out, err = proc.communicate(timeout=120)
        pytest.fail(f"the soak took more than {TIMEOUT} s\n{out}\n{err}")
    finally:
        connections.close_all()  # the server restarted under this process's own sessions
    assert proc.returncode in {0, 1}, f"exit {proc.returncode}\n{out}\n{err}"
    record = json.loads((RECORDS / "last.json").read_text())
    record["exit"], record["output"] = proc.returncode, out
    return record


def check(soak: dict, name: str) -> None:
    found = next(check for check in soak["checks"] if check["name"] == name)
    assert found["passed"], f"{name}: {found['detail']}\n{soak['output']}"


def test_the_soak_ran_its_seeds_plan_and_its_verdict_is_its_exit_status(soak):
    assert soak["plan"] == [
        action.as_json()
        for action in plan(seed=SEED, duration=DURATION, kinds=KINDS, replicas=3, reminders=True)
    ]
    kinds = ["kill", "pg-restart", "pause", "smtp-lost-reply"]
    assert [action["kind"] for action in soak["actions"]] == kinds
    # The holder was frozen inside its fenced write, and that write never committed: the server
    # ended its transaction (the proxies saw every committed fenced write end within its lease).
    pause = next(action for action in soak["actions"] if action["kind"] == "pause")
    assert pause["target"].endswith("(inside its fenced write)"), pause
    assert soak["fenced_commits"]["longest_seconds"] <= TTL + COMMIT_TOLERANCE, soak["fenced_commits"]
    assert soak["catch_up"] == "all"
    assert soak["exit"] == (0 if soak["passed"] else 1)
    assert soak["passed"] is all(check["passed"] for check in soak["checks"])
    assert len(soak["window"]) >= DURATION // 10 + 3
    # The reminders part ran: reminders due through the soak, a reply the stand-in lost.
    assert soak["reminders"]["judged"] >= DURATION * REMINDERS_PER_MINUTE // 60, soak["reminders"]
    assert soak["reminders"]["lost_replies"] >= 1, soak["reminders"]
    # The kill was aimed at a send_reminders run while it was sending, and landed in it: the
    # checker counts a kill of a replica whose run died with it (running, or abandoned).
    kill = next(action for action in soak["actions"] if action["kind"] == "kill")
    assert kill["target"].endswith("(inside its send_reminders run)"), kill
    assert soak["reminders"]["run_kills"] >= 1, soak["reminders"]


def test_no_slot_is_written_twice(soak):
    check(soak, "one-write-per-slot")


def test_every_slot_of_the_window_has_its_row(soak):
    check(soak, "no-lost-slot")


def test_every_row_was_written_under_a_lease_in_force(soak):
    check(soak, "writes-under-their-lease")


def test_every_slot_that_ran_has_one_success_the_run_that_wrote_it(soak):
    check(soak, "one-success-per-slot")


def test_no_run_is_left_running(soak):
    check(soak, "no-run-left-running")


def test_no_replica_printed_a_traceback(soak):
    check(soak, "no-traceback")


def test_no_contender_waited_longer_than_the_ttl_to_skip(soak):
    check(soak, "bounded-waits")


def test_every_sigterm_stopped_its_replica(soak):
    check(soak, "replicas-stop-on-sigterm")


def test_every_fenced_write_the_server_acknowledged_kept_its_row(soak):
    check(soak, "acknowledged-commits-kept")


def test_no_reminder_was_emailed_twice_beyond_the_documented_resends(soak):
    check(soak, "reminder-once")


def test_a_lost_smtp_reply_leaves_its_reminder_uncertain_and_never_re_sent(soak):
    check(soak, "uncertain-not-resent")


def test_every_reminder_due_by_the_last_slot_was_delivered_or_settled(soak):
    check(soak, "reminders-delivered")
