"""POST /api/jobs/<job>/run: the HTTP trigger for external schedulers, for every registered job
(the host project's, here; tests/contests/test_trigger.py runs the sync through it)."""

from __future__ import annotations

import secrets
import socket
import subprocess
import sys
import time
from datetime import timedelta

import pytest
import requests
from django.db import connection
from django.test import Client, RequestFactory

from locks.lease import acquire
from locks.models import JobRun, Outcome, SyncLock, Throttle, now_plus
from locks.registry import get_job
from locks.views import client_address
from tests.conftest import ROOT, gunicorn, project_env
from tests.jobsapp.models import SlotWrite

JOB = "write_slot"
URL = f"/api/jobs/{JOB}/run"
TOKEN = secrets.token_urlsafe(32)
AUTH = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}


@pytest.fixture
def trigger(settings, transactional_db):
    """The trigger enabled."""
    settings.LOCKS_TRIGGER_TOKEN = TOKEN


def written() -> int:
    """How many runs of the job wrote their row (the job's one write, under the token)."""
    return SlotWrite.objects.count()


def post(client: Client, query: str = "", *, addr: str = "192.0.2.1", **headers):
    return client.post(URL + query, REMOTE_ADDR=addr, **{**AUTH, **headers})


# --- enabled, methods, authentication -------------------------------------------


@pytest.mark.parametrize("method", ["get", "post"])
def test_disabled_without_the_token_setting(client, settings, transactional_db, method):
    settings.LOCKS_TRIGGER_TOKEN = ""
    response = getattr(client, method)(URL, HTTP_AUTHORIZATION="Bearer ")
    assert response.status_code == 404
    assert written() == 0


@pytest.mark.parametrize("method", ["get", "put", "patch", "delete"])
def test_other_methods_are_not_allowed(client, trigger, method):
    response = getattr(client, method)(URL, **AUTH)
    assert response.status_code == 405
    assert response["Allow"] == "POST"
    assert written() == 0


@pytest.mark.parametrize(
    "header",
    [
        None,
        "",
        "Bearer",
        "Bearer ",
        "Bearer wrong-token",
        f"Bearer {TOKEN[:-1]}",
        f"Bearer {TOKEN}x",
        f"Basic {TOKEN}",
        TOKEN,
    ],
    ids=["missing", "empty", "scheme-only", "blank", "wrong", "prefix", "longer", "basic", "no-scheme"],
)
def test_a_missing_or_wrong_token_is_401_with_no_hint(client, trigger, header):
    headers = {} if header is None else {"HTTP_AUTHORIZATION": header}
    response = client.post(URL, **headers)
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="job trigger"'
    assert response.json() == {"error": "authentication required"}
    assert TOKEN not in response.content.decode()
    # Nothing ran, and nothing was written, not even a rate-limit row.
    assert written() == 0
    assert not SyncLock.objects.exists()
    assert not Throttle.objects.exists()


def test_the_right_token_runs_the_job_for_the_tick_of_now(client, trigger, caplog):
    caplog.set_level("INFO", logger="locks.views")
    response = post(client, HTTP_AUTHORIZATION=f"bearer  {TOKEN} ")  # scheme is case-insensitive
    assert response.status_code == 200, response.content
    body = response.json()
    assert body["outcome"] == "succeeded"
    assert body["job"] == JOB
    assert body["tick"] == get_job(JOB).current_tick().isoformat()
    assert body["forced"] is False
    assert body["holder"].startswith(f"{socket.gethostname()}:")
    assert body["counts"] == {"written": 1}
    row = SlotWrite.objects.get()
    assert (row.tick.isoformat(), row.token, row.holder) == (body["tick"], body["token"], body["holder"])
    run = JobRun.objects.get()
    assert (run.status, run.holder, run.token) == (Outcome.SUCCEEDED, body["holder"], body["token"])
    # The token leaves the database with its history: the pair (timeline, token), null off PostgreSQL.
    assert body["timeline"] == run.timeline
    assert (body["timeline"] is not None) == (connection.vendor == "postgresql")
    assert response["Content-Type"] == "application/json"
    assert f"job={JOB} triggered over HTTP by 192.0.2.1" in caplog.messages
    assert "no-store" in response["Cache-Control"]


def test_csrf_is_exempt_for_the_trigger_only(trigger):
    client = Client(enforce_csrf_checks=True)
    assert post(client).status_code == 200
    login = client.post("/admin/login/", {"username": "x", "password": "y"})
    assert login.status_code == 403


def test_a_bad_force_flag_is_400_and_changes_nothing(client, trigger):
    response = post(client, "?force=maybe")
    assert response.status_code == 400
    assert response.json() == {"error": "force='maybe' is not a flag; use force=1 or leave it out"}
    assert written() == 0
    assert not Throttle.objects.exists()


# --- outcomes -----------------------------------------------------------------


def test_409_when_the_tick_is_already_claimed(client, trigger):
    first = post(client, addr="192.0.2.1")
    assert first.status_code == 200
    second = post(client, addr="192.0.2.2")
    assert second.status_code == 409
    body = second.json()
    assert body["outcome"] == "skipped"
    assert body["skip"]["kind"] == "tick_claimed"
    assert body["skip"]["holder"] == first.json()["holder"]
    assert body["skip"]["claimed_tick"] == first.json()["tick"]
    assert body["reason"] == f"tick {first.json()['tick']} already done by {first.json()['holder']}"
    assert body["counts"] == {}
    assert written() == 1
    assert JobRun.objects.count() == 1


def test_force_ignores_the_claimed_tick(client, trigger):
    assert post(client, addr="192.0.2.1").status_code == 200
    forced = post(client, "?force=1", addr="192.0.2.2")
    assert forced.status_code == 200
    body = forced.json()
    assert (body["outcome"], body["tick"], body["forced"]) == ("succeeded", None, True)
    assert body["counts"] == {"written": 1}
    assert list(SlotWrite.objects.order_by("token").values_list("tick", flat=True))[1] is None
    assert written() == 2


def test_409_when_the_lock_is_held_even_with_force(client, trigger):
    lease = acquire(job=JOB, tick=None, ttl=timedelta(minutes=5), holder="other-host:4242:abcdef")
    response = post(client, "?force=1")
    assert response.status_code == 409
    body = response.json()
    assert body["skip"]["kind"] == "held"
    assert body["skip"]["holder"] == "other-host:4242:abcdef"
    assert body["reason"] == f"held by other-host:4242:abcdef until {body['skip']['locked_until']}"
    assert written() == 0
    assert SyncLock.objects.get().token == lease.token


# --- every registered job ------------------------------------------------------------


def test_a_second_job_runs_through_the_same_endpoint(client, trigger):
    response = client.post("/api/jobs/record/run", REMOTE_ADDR="192.0.2.1", **AUTH)
    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["job"], body["outcome"], body["counts"], body["forced"]) == (
        "record",
        "succeeded",
        {"recorded": 1, "ttl": 60},
        False,
    )
    assert body["tick"].endswith(":00+00:00") and int(body["tick"][14:16]) % 5 == 0  # */5 * * * *
    run = JobRun.objects.get()
    assert (run.job_name, run.status, run.stats) == (
        "record",
        Outcome.SUCCEEDED,
        {"recorded": 1, "ttl": 60},
    )
    assert written() == 0  # write_slot did not run

    # Its own tick, its own rate-limit window: write_slot is not limited by it.
    assert client.post("/api/jobs/record/run", REMOTE_ADDR="192.0.2.1", **AUTH).status_code == 429
    assert post(client, addr="192.0.2.1").status_code == 200
    assert sorted(Throttle.objects.values_list("key", flat=True)) == [
        "record:192.0.2.1",
        f"{JOB}:192.0.2.1",
    ]


def test_an_expected_failure_of_a_job_is_502_and_mails_no_admin(client, trigger, settings, mailoutbox):
    settings.ADMINS = [("Ops", "ops@example.com")]  # the trigger's answer is not a server error (issue 35)
    response = client.post("/api/jobs/refuse/run", REMOTE_ADDR="192.0.2.1", **AUTH)
    assert response.status_code == 502
    body = response.json()
    assert (body["job"], body["outcome"], body["error"]) == ("refuse", "failed", "nothing to record today")
    assert JobRun.objects.get().status == Outcome.FAILED
    assert mailoutbox == []


def test_an_unknown_job_is_404_with_the_registered_names(client, trigger):
    response = client.post("/api/jobs/nope/run", REMOTE_ADDR="192.0.2.1", **AUTH)
    assert response.status_code == 404
    assert response["Content-Type"] == "application/json"
    assert response.json() == {
        "error": "no job named 'nope' in LOCKS_JOBS (registered: write_slot, record, refuse, linger, slow_write, check_jobs)"
    }
    assert not Throttle.objects.exists()
    assert not SyncLock.objects.exists()


def test_an_unknown_job_without_the_token_is_401_and_names_nothing(client, trigger):
    response = client.post("/api/jobs/nope/run")
    assert response.status_code == 401
    assert response.json() == {"error": "authentication required"}


# --- rate limit ---------------------------------------------------------------


def test_one_request_per_client_address_per_window(client, trigger):
    assert post(client, addr="192.0.2.1").status_code == 200
    limited = post(client, "?force=1", addr="192.0.2.1")
    assert limited.status_code == 429
    assert 1 <= int(limited["Retry-After"]) <= 10
    assert limited.json()["error"].startswith("rate limited: one request per 10 s per client; retry in ")
    assert written() == 1  # the limited request never ran the job
    # Another address is not limited by the first one's window.
    assert post(client, "?force=1", addr="192.0.2.2").status_code == 200
    assert written() == 2


def test_the_window_reopens_after_it_ends(client, trigger):
    assert post(client, addr="192.0.2.1").status_code == 200
    assert post(client, addr="192.0.2.1").status_code == 429
    Throttle.objects.update(
        until=now_plus(-timedelta(seconds=1))
    )  # the window ended a second ago (database clock)
    assert post(client, "?force=1", addr="192.0.2.1").status_code == 200
    assert post(client, "?force=1", addr="192.0.2.1").status_code == 429


def test_x_forwarded_for_is_ignored_unless_a_proxy_is_trusted(client, trigger):
    assert post(client, addr="10.0.0.9", HTTP_X_FORWARDED_FOR="198.51.100.1").status_code == 200
    spoofed = post(client, "?force=1", addr="10.0.0.9", HTTP_X_FORWARDED_FOR="198.51.100.2")
    assert spoofed.status_code == 429
    assert list(Throttle.objects.values_list("key", flat=True)) == [f"{JOB}:10.0.0.9"]


def test_behind_a_trusted_proxy_the_client_is_the_address_it_appended(client, trigger, settings):
    settings.LOCKS_TRUSTED_PROXY_COUNT = 1
    proxy = "10.0.0.9"
    assert post(client, addr=proxy, HTTP_X_FORWARDED_FOR="1.1.1.1, 203.0.113.5").status_code == 200
    # The client rewrote the part of the header it controls: still the same client.
    again = post(client, "?force=1", addr=proxy, HTTP_X_FORWARDED_FOR="2.2.2.2, 203.0.113.5")
    assert again.status_code == 429
    other = post(client, "?force=1", addr=proxy, HTTP_X_FORWARDED_FOR="203.0.113.6")
    assert other.status_code == 200
    assert sorted(Throttle.objects.values_list("key", flat=True)) == [
        f"{JOB}:203.0.113.5",
        f"{JOB}:203.0.113.6",
    ]


def test_ipv6_zone_ids_do_not_make_new_clients(client, trigger, settings):
    settings.LOCKS_TRUSTED_PROXY_COUNT = 1
    proxy = "10.0.0.9"
    assert post(client, addr=proxy, HTTP_X_FORWARDED_FOR="fe80::1%eth0").status_code == 200
    for zone in ("eth1", "lo", "1", "x" * 20):
        again = post(client, "?force=1", addr=proxy, HTTP_X_FORWARDED_FOR=f"fe80::1%{zone}")
        assert again.status_code == 429, zone
    assert list(Throttle.objects.values_list("key", flat=True)) == [f"{JOB}:fe80::1"]


def test_an_over_long_forwarded_address_falls_back_to_the_peer(client, trigger, settings):
    """300 characters that Python's ipaddress would take as a scoped IPv6 address:
    the rate-limit key is the proxy's address, and the trigger answers normally
    (this used to be a 503 "database unreachable" on PostgreSQL: the key did not fit)."""
    settings.LOCKS_TRUSTED_PROXY_COUNT = 1
    forwarded = "fe80::1%" + "x" * 292
    assert len(forwarded) == 300

    response = post(client, addr="10.0.0.9", HTTP_X_FORWARDED_FOR=forwarded)

    assert response.status_code == 200, response.content
    assert response.json()["outcome"] == "succeeded"
    assert list(Throttle.objects.values_list("key", flat=True)) == [f"{JOB}:10.0.0.9"]


@pytest.mark.parametrize(
    ("proxies", "forwarded", "expected"),
    [
        (0, "198.51.100.1", "10.0.0.9"),
        (1, "", "10.0.0.9"),
        (1, "198.51.100.1", "198.51.100.1"),
        (1, "6.6.6.6, 198.51.100.1", "198.51.100.1"),
        (2, "6.6.6.6, 198.51.100.1, 10.0.0.8", "198.51.100.1"),
        (3, "198.51.100.1, 10.0.0.8", "198.51.100.1"),
        (1, "2001:db8::1", "2001:db8::1"),
        (1, "not-an-address", "10.0.0.9"),
        (1, "2001:DB8:0:0::1", "2001:db8::1"),  # one canonical form per address
        (1, "fe80::1%eth0", "fe80::1"),  # the proxy's interface, not another client
        (1, "::ffff:198.51.100.1", "198.51.100.1"),
        (1, "198.51.100.1%eth0", "10.0.0.9"),
        (1, "198.51.100.1:4711", "10.0.0.9"),
        (1, "fe80::1%" + "x" * 292, "10.0.0.9"),  # 300 characters: not an address
    ],
)
def test_client_address(settings, proxies, forwarded, expected):
    settings.LOCKS_TRUSTED_PROXY_COUNT = proxies
    request = RequestFactory().post(URL, REMOTE_ADDR="10.0.0.9", HTTP_X_FORWARDED_FOR=forwarded)
    assert client_address(request) == expected


SETUP_AND_RUN = "import sys, django; django.setup(); exec(sys.argv[1])"
CLAIM = """
import pathlib, sys, time
from datetime import timedelta
from locks.views import throttle_claim
pathlib.Path(sys.argv[-2]).touch()
go = pathlib.Path(sys.argv[-1])
while not go.exists():
    time.sleep(0.002)
print(throttle_claim(key="race", window=timedelta(seconds=60)).allowed)
"""


@pytest.mark.slow
def test_the_rate_limit_holds_across_processes(db_url, tmp_path):
    """Three OS processes claim the same key at the same moment: exactly one wins."""
    env = project_env(DATABASE_URL=db_url)
    go = tmp_path / "go"
    processes = [
        subprocess.Popen(
            [sys.executable, "-c", SETUP_AND_RUN, CLAIM, str(tmp_path / f"ready{i}"), str(go)],
            cwd=ROOT,
            env=env,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for i in range(3)
    ]
    deadline = time.monotonic() + 60
    while not all((tmp_path / f"ready{i}").exists() for i in range(3)):
        assert time.monotonic() < deadline, "the claiming processes did not start"
        assert all(p.poll() is None for p in processes), [p.communicate() for p in processes]
        time.sleep(0.01)
    go.touch()
    outputs = [p.communicate(timeout=60) for p in processes]
    assert [p.returncode for p in processes] == [0, 0, 0], outputs
    assert sorted(out.strip() for out, _err in outputs) == ["False", "False", "True"]
    assert Throttle.objects.filter(key="race").count() == 1


# --- a real unreachable database --------------------------------------------------


@pytest.fixture(params=["postgres", "sqlite"])
def unreachable_database(request, tmp_path):
    """A PostgreSQL URL whose port is bound but not listening (connection refused),
    or an SQLite file in a directory that does not exist."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path}/missing/db.sqlite3"
        return
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # held, never listened on: nobody else can take the port
        yield f"postgres://nobody@127.0.0.1:{closed.getsockname()[1]}/contests"


def test_503_when_the_database_is_unreachable(unreachable_database, tmp_path):
    env = project_env(DATABASE_URL=unreachable_database, LOCKS_TRIGGER_TOKEN=TOKEN)
    log = tmp_path / "gunicorn.log"
    with gunicorn(env=env, log=log) as base:
        response = requests.post(base + URL, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
    output = log.read_text()
    assert response.status_code == 503, output
    body = response.json()
    assert body["outcome"] == "skipped"
    assert body["reason"].startswith("database unreachable: OperationalError: "), body
    warning = f"WARNING locks.views job={JOB} trigger from 127.0.0.1 skipped: database unreachable"
    assert warning in output
    assert "Traceback" not in output


@pytest.mark.slow
def test_a_real_server_runs_the_job_then_limits_the_caller(db_url, tmp_path):
    """gunicorn serving the host project: the job runs in the request, under its lease, and a
    second request from the same client within the window is refused before it runs anything."""
    env = project_env(DATABASE_URL=db_url, LOCKS_TRIGGER_TOKEN=TOKEN)
    headers = {"Authorization": f"Bearer {TOKEN}"}
    log = tmp_path / "gunicorn.log"
    with gunicorn(env=env, log=log) as base:
        ran = requests.post(base + URL, headers=headers, timeout=60)
        limited = requests.post(base + URL + "?force=1", headers=headers, timeout=60)

    assert ran.status_code == 200, log.read_text()
    body = ran.json()
    assert (body["job"], body["outcome"], body["counts"]) == (JOB, "succeeded", {"written": 1})
    row = SlotWrite.objects.get()
    assert (row.tick.isoformat(), row.token) == (body["tick"], body["token"])
    assert limited.status_code == 429
    assert 1 <= int(limited.headers["Retry-After"]) <= 10
    assert written() == 1
    assert list(Throttle.objects.values_list("key", flat=True)) == [f"{JOB}:127.0.0.1"]
    assert "Traceback" not in log.read_text()
