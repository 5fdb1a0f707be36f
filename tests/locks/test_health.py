"""GET /healthz: is each job keeping up, is the database there, what are the locks doing.

The host project's ``write_slot`` runs hourly here, and is the one registered job unless a
test registers another; it is LOCKS_HEALTHZ_JOB, so its fields are at the top level too."""

from __future__ import annotations

import secrets
import socket
from datetime import datetime, timedelta

import pytest
import requests
from django.core.checks import run_checks
from django.db import connection
from django.db.models import F
from django.test.utils import CaptureQueriesContext

from locks.lease import acquire
from locks.models import JobRun, Outcome, SyncLock, database_now, now_plus
from locks.operator import pause_job
from locks.runner import run_job
from locks.schedule import Schedule
from locks.status import jobs_health
from tests.conftest import gunicorn, project_env
from tests.hostproject.settings import RECORD
from tests.locks.conftest import register, reschedule

URL = "/healthz"
JOB_NAME = "write_slot"
TOKEN = secrets.token_urlsafe(32)  # LOCKS_HEALTHZ_TOKEN: read-only health details
TRIGGER_TOKEN = secrets.token_urlsafe(32)  # LOCKS_TRIGGER_TOKEN: starts runs, shows no details
HOUR = 3600
ONE_HOUR = timedelta(hours=1)


@pytest.fixture(autouse=True)
def hourly(settings):
    """``write_slot`` alone, on an hourly schedule (without the app's own check_jobs, which
    test_alerts.py runs)."""
    settings.LOCKS_JOBS = {JOB_NAME: {**settings.LOCKS_JOBS[JOB_NAME], "schedule": "0 * * * *"}}
    settings.LOCKS_CHECK_JOBS = False


@pytest.fixture
def synced(settings, transactional_db):
    """One real, successful run of the job: its row written under its lease."""
    settings.LOCKS_HEALTHZ_TOKEN = TOKEN
    settings.LOCKS_TRIGGER_TOKEN = TRIGGER_TOKEN
    result = run_job(name=JOB_NAME, force=True)
    assert result.outcome == "succeeded", result.describe()
    return result


def finished_at(moment: datetime, *, job: str = JOB_NAME) -> int:
    """Set every successful run's end to ``moment``."""
    return JobRun.objects.filter(job_name=job, status=Outcome.SUCCEEDED).update(finished_at=moment)


def finished_ago(seconds: float, *, job: str = JOB_NAME) -> int:
    """Move every successful run's end ``seconds`` into the past, on the database clock."""
    return JobRun.objects.filter(job_name=job, status=Outcome.SUCCEEDED).update(
        finished_at=now_plus(-timedelta(seconds=seconds))
    )


def test_fresh_after_a_sync(client, synced, django_assert_num_queries):
    with django_assert_num_queries(1):  # the lock row, with its newest successful run
        response = client.get(URL)
    assert response.status_code == 200
    body = response.json()
    assert body["status"] == "ok"
    assert body["database"] is True
    assert body["job"] == JOB_NAME
    assert body["schedule"] == "0 * * * *"
    finished = JobRun.objects.get().finished_at
    assert body["last_success_at"] == finished.isoformat()
    # stale once two hourly slots passed without a success: from the second after it
    assert (
        body["stale_after"] == (Schedule("0 * * * *").slot_at_or_before(finished) + 2 * ONE_HOUR).isoformat()
    )
    assert 0 <= body["last_success_age_seconds"] < 60
    assert body["lock"]["state"] == "free"
    assert body["lock"]["last_status"] == "succeeded"
    assert body["lock"]["token"] == synced.token
    assert "no-store" in response["Cache-Control"]
    # The same, per job: write_slot is the only registered job here.
    [(name, job)] = body["jobs"].items()
    assert name == JOB_NAME
    assert job == {"status": "ok", **{key: body[key] for key in job if key != "status"}}
    assert set(job) == {
        "status",
        "schedule",
        "stale_after",
        "last_success_at",
        "last_success_age_seconds",
        "lock",
    }


@pytest.fixture
def running(synced):
    """A run in progress on this host: the lock row names its holder."""
    return acquire(
        job=JOB_NAME, tick=None, ttl=timedelta(minutes=10), holder=f"{socket.gethostname()}:4242:abcdef"
    )


def test_no_holder_host_names_without_the_health_token(client, running):
    for headers in (
        {},
        {"HTTP_AUTHORIZATION": "Bearer wrong"},
        {"HTTP_AUTHORIZATION": f"Bearer {TRIGGER_TOKEN}"},  # the trigger token unlocks nothing here
    ):
        response = client.get(URL, **headers)
        assert response.status_code == 200  # a wrong token does not fail the check
        lock = response.json()["lock"]
        assert lock["state"] == "held"
        assert "holder" not in lock
        assert "last_error" not in lock
        assert running.holder not in response.content.decode()
        assert f'"{socket.gethostname()}:' not in response.content.decode()  # no "host:pid:…" value


def test_the_health_token_reveals_the_holder(client, running):
    response = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    lock = response.json()["lock"]
    assert lock["state"] == "held"
    assert lock["holder"] == running.holder
    assert lock["token"] == running.token
    assert lock["locked_until"] is not None
    assert lock["last_error"] == ""


def test_fresh_while_the_success_is_at_or_after_the_slot_before_the_latest(client, synced):
    before_latest = Schedule("0 * * * *").slot_at_or_before(database_now()) - ONE_HOUR
    assert finished_at(before_latest + timedelta(seconds=1)) == 1
    response = client.get(URL)
    assert response.status_code == 200
    assert response.json()["stale_after"] == (before_latest + 2 * ONE_HOUR).isoformat()

    finished_at(before_latest - timedelta(seconds=1))
    response = client.get(URL)
    assert response.status_code == 503
    assert response.json()["stale_after"] == (before_latest + ONE_HOUR).isoformat()


def test_stale_after_two_schedule_periods(client, synced):
    assert finished_ago(2 * HOUR + 1) == 1
    response = client.get(URL)
    assert response.status_code == 503
    body = response.json()
    assert (body["status"], body["database"]) == ("stale", True)
    assert body["last_success_age_seconds"] > 2 * HOUR


def test_the_limit_follows_the_schedule(client, synced, settings):
    reschedule(settings, JOB_NAME, "*/5 * * * *")
    finished_ago(11 * 60)
    response = client.get(URL)
    assert response.status_code == 503
    finished = JobRun.objects.get().finished_at
    stale_after = Schedule("*/5 * * * *").slot_at_or_before(finished) + timedelta(minutes=10)
    assert response.json()["stale_after"] == stale_after.isoformat()


def test_a_failed_run_after_a_success_does_not_hide_the_success(client, synced, settings):
    # The same job, failing this time the way its expected errors do.
    failing = {"callable": "tests.jobsapp.jobs.refuse", "expected_errors": ["tests.jobsapp.jobs.Refused"]}
    register(settings, **{JOB_NAME: {**settings.LOCKS_JOBS[JOB_NAME], **failing}})
    assert run_job(name=JOB_NAME, force=True).outcome == "failed_expected"
    response = client.get(URL)
    assert response.status_code == 200
    body = response.json()
    assert body["lock"]["last_status"] == "failed"
    assert body["last_success_at"] == JobRun.objects.get(status=Outcome.SUCCEEDED).finished_at.isoformat()
    assert (
        "nothing to record today"
        in client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").json()["lock"]["last_error"]
    )
    assert "nothing to record today" not in response.content.decode()


def test_never_synced_is_unhealthy(client, transactional_db):
    response = client.get(URL)
    assert response.status_code == 503
    body = response.json()
    assert (body["status"], body["database"]) == ("stale", True)
    assert body["last_success_at"] is None
    assert body["last_success_age_seconds"] is None
    assert body["lock"] is None


def test_a_job_first_seen_within_its_last_two_slots_is_ok_until_they_pass(client, transactional_db):
    """A new deployment: check_jobs (or a skipped run, or an operator) created the job's lock row,
    and it has not run yet. Was: 503 until its first success, an hourly job's first hour; now judged
    from its row's creation, as check_jobs judges it: stale once two slots passed without a success."""
    SyncLock.objects.create(job_name=JOB_NAME, created_at=database_now())

    new = client.get(URL)
    assert (new.status_code, new.json()["status"], new.json()["last_success_at"]) == (200, "ok", None)

    SyncLock.objects.update(created_at=now_plus(-timedelta(hours=2, minutes=1)))
    old = client.get(URL)
    assert (old.status_code, old.json()["status"]) == (503, "stale")


def test_only_get_and_head(client, transactional_db):
    assert client.head(URL).status_code == 503  # never synced, but answered
    response = client.post(URL)
    assert response.status_code == 405
    assert response["Allow"] == "GET, HEAD"


def test_503_when_the_database_is_down(tmp_path):
    """A real PostgreSQL URL whose port refuses connections, served by gunicorn."""
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # held, never listened on
        url = f"postgres://nobody@127.0.0.1:{closed.getsockname()[1]}/contests"
        env = project_env(DATABASE_URL=url, LOCKS_HEALTHZ_TOKEN=TOKEN, LOCKS_TRIGGER_TOKEN=TRIGGER_TOKEN)
        log = tmp_path / "gunicorn.log"
        with gunicorn(env=env, log=log) as base:
            anonymous = requests.get(base + URL, timeout=60)
            trusted = requests.get(base + URL, headers={"Authorization": f"Bearer {TOKEN}"}, timeout=60)
            trigger = requests.get(
                base + URL, headers={"Authorization": f"Bearer {TRIGGER_TOKEN}"}, timeout=60
            )
    output = log.read_text()
    assert anonymous.status_code == 503, output
    assert anonymous.json() == {"status": "database unreachable", "database": False, "job": JOB_NAME}
    assert trusted.status_code == 503
    assert trusted.json()["database"] is False
    assert trusted.json()["error"].startswith("OperationalError: ")
    assert trigger.json() == anonymous.json()  # the trigger token unlocks no detail
    assert "Traceback" not in output


# --- plain HTTP: probes pass, credentials are redirected ------------------------------


@pytest.fixture
def https_only(settings, synced):
    settings.SECURE_SSL_REDIRECT = True
    settings.SECURE_REDIRECT_EXEMPT = [r"^healthz$"]


def test_a_plain_http_probe_without_credentials_is_answered(client, https_only, running):
    response = client.get(URL)
    assert response.status_code == 200
    assert response.json()["lock"]["state"] == "held"
    assert client.get("/admin/login/").status_code == 301  # every other path is redirected


@pytest.mark.parametrize(
    "header",
    [f"Bearer {TOKEN}", f"Bearer {TRIGGER_TOKEN}", "Bearer wrong", "Basic dXNlcjpwYXNz", "", "x"],
    ids=["health-token", "trigger-token", "wrong", "basic", "empty", "garbage"],
)
def test_a_plain_http_request_with_credentials_is_redirected(client, https_only, running, header):
    for method in (client.get, client.head):
        response = method(URL + "?x=1", HTTP_AUTHORIZATION=header)
        assert response.status_code == 301
        assert response["Location"] == "https://testserver/healthz?x=1"
        assert running.holder not in response.content.decode()


def test_over_https_the_health_token_reveals_the_holder(client, https_only, running):
    response = client.get(URL, secure=True, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert response.json()["lock"]["holder"] == running.holder


def test_without_the_https_redirect_credentials_over_plain_http_are_answered(client, settings, running):
    settings.SECURE_SSL_REDIRECT = False  # TLS is the proxy's business (it redirects)
    response = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert response.status_code == 200
    assert response.json()["lock"]["holder"] == running.holder


# --- the health token's system checks ---------------------------------------------------


def test_health_token_checks(settings):
    def ids() -> set[str]:
        return {message.id for message in run_checks(include_deployment_checks=True)} & {
            "locks.W001",
            "locks.W002",
            "locks.W003",
        }

    settings.LOCKS_TRIGGER_TOKEN = TRIGGER_TOKEN
    settings.LOCKS_HEALTHZ_TOKEN = "too-short"
    assert ids() == {"locks.W002"}
    settings.LOCKS_HEALTHZ_TOKEN = TRIGGER_TOKEN
    assert ids() == {"locks.W003"}
    settings.LOCKS_HEALTHZ_TOKEN = TOKEN
    assert ids() == set()
    settings.LOCKS_TRIGGER_TOKEN = "short"
    assert ids() == {"locks.W001"}
    settings.LOCKS_TRIGGER_TOKEN = settings.LOCKS_HEALTHZ_TOKEN = ""
    assert ids() == set()


# --- Uneven schedules: stale only once two slots passed without a success -------------
# The database clock cannot be set, so each schedule is built around its now: slots
# at the same minute of the day as "now minus a bit", on chosen days of the week.


def _cron_weekday(moment: datetime) -> int:
    return (moment.weekday() + 1) % 7  # cron counts from Sunday = 0


def test_two_slots_a_day_fresh_at_1101_after_a_success_at_0900(client, synced, settings):
    """``0 8,9 * * *`` at 11:01 with a success at 09:00:30: nothing was missed."""
    now = database_now()
    nine = (now - timedelta(hours=2, minutes=1)).replace(second=0, microsecond=0)  # "09:00"
    eight = nine - ONE_HOUR
    reschedule(settings, JOB_NAME, f"{nine.minute} {eight.hour},{nine.hour} * * *")
    finished_at(nine + timedelta(seconds=30))
    response = client.get(URL)
    assert response.status_code == 200, response.json()
    # tomorrow's "08:00" and "09:00" pass without a success: stale at the second
    assert response.json()["stale_after"] == (nine + timedelta(days=1)).isoformat()


def test_weekdays_only_fresh_all_weekend_after_fridays_success(client, synced, settings):
    """``0 9 * * 1-5`` on a Sunday with a success on Friday at 09:00:30."""
    now = database_now()
    friday = (now - timedelta(days=2, hours=1)).replace(second=0, microsecond=0)  # "Friday 09:00"
    saturday, sunday = now - timedelta(days=1), now
    weekdays = sorted(set(range(7)) - {_cron_weekday(saturday), _cron_weekday(sunday)})
    reschedule(settings, JOB_NAME, f"{friday.minute} {friday.hour} * * {','.join(map(str, weekdays))}")
    finished_at(friday + timedelta(seconds=30))
    response = client.get(URL)
    assert response.status_code == 200, response.json()
    # "Monday" and "Tuesday" pass without a success: stale at the second
    assert response.json()["stale_after"] == (friday + timedelta(days=4)).isoformat()


def test_hourly_stale_after_two_hours_and_a_minute(client, synced):
    assert finished_ago(2 * HOUR + 60) == 1
    response = client.get(URL)
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "stale"
    assert datetime.fromisoformat(body["stale_after"]) <= database_now()


# --- every registered job ---------------------------------------------------------------


def test_a_second_job_that_never_ran_makes_the_whole_answer_stale(client, synced, settings):
    register(settings, record=RECORD)
    response = client.get(URL)
    assert response.status_code == 503
    body = response.json()
    assert body["status"] == "stale"  # the top level speaks for every job
    assert (body["job"], body["last_success_at"]) == (JOB_NAME, body["jobs"][JOB_NAME]["last_success_at"])
    assert body["jobs"][JOB_NAME]["status"] == "ok"
    assert body["jobs"]["record"] == {
        "status": "stale",
        "schedule": "*/5 * * * *",
        "stale_after": None,
        "last_success_at": None,
        "last_success_age_seconds": None,
        "lock": None,
    }


def test_each_job_is_fresh_by_its_own_schedule(client, synced, settings, django_assert_num_queries):
    register(settings, record=RECORD)
    assert run_job(name="record", force=True).outcome == "succeeded"
    with django_assert_num_queries(1):  # whatever the number of jobs
        response = client.get(URL)
    assert response.status_code == 200, response.json()
    jobs = response.json()["jobs"]
    assert [jobs[name]["status"] for name in (JOB_NAME, "record")] == ["ok", "ok"]
    assert jobs["record"]["lock"]["last_status"] == "succeeded"
    assert "holder" not in jobs["record"]["lock"]

    # Eleven minutes without a success: two of record's five-minute slots, not two hours.
    finished_ago(11 * 60, job="record")
    response = client.get(URL)
    assert response.status_code == 503
    body = response.json()
    assert (body["status"], body["jobs"][JOB_NAME]["status"], body["jobs"]["record"]["status"]) == (
        "stale",
        "ok",
        "stale",
    )
    trusted = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").json()
    assert {"holder", "last_error"} <= set(trusted["jobs"]["record"]["lock"])  # released: both ""


def test_without_the_healthz_job_registered_only_the_jobs_are_reported(client, synced, settings):
    settings.LOCKS_JOBS = {"record": RECORD}
    run_job(name="record", force=True)
    response = client.get(URL)
    assert response.status_code == 200
    body = response.json()
    assert set(body) == {"status", "database", "jobs"}
    assert list(body["jobs"]) == ["record"]


def test_who_paused_a_job_and_their_note_are_details_for_the_token_only(client, synced):
    """Issue 35, item 12: an anonymous probe saw the operator's name and free text."""
    pause_job(job=JOB_NAME, by="admin:alice", note="mail relay of ops-db-3 down, ask bob")
    anonymous = client.get(URL).json()["jobs"][JOB_NAME]["lock"]
    assert anonymous["paused"] is True and anonymous["paused_at"]
    assert not {"paused_by", "paused_note", "holder", "last_error"} & set(anonymous)
    trusted = client.get(URL, HTTP_AUTHORIZATION=f"Bearer {TOKEN}").json()["jobs"][JOB_NAME]["lock"]
    assert (trusted["paused_by"], trusted["paused_note"]) == (
        "admin:alice",
        "mail relay of ops-db-3 down, ask bob",
    )


def test_a_stale_job_answers_503_to_every_probe_without_mailing_admins_but_a_real_500_does(
    client, synced, settings, mailoutbox, monkeypatch
):
    """Issue 35, item 15: Django's mail_admins handler mailed each 503 of an anonymous probe."""
    settings.ADMINS = [("Ops", "ops@example.com")]
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    finished_ago(3 * HOUR)
    assert [client.get(URL).status_code for _ in range(20)] == [503] * 20
    assert mailoutbox == []

    def broken():
        raise RuntimeError("a bug")

    monkeypatch.setattr("locks.views.jobs_freshness", broken)
    client.raise_request_exception = False
    assert client.get(URL).status_code == 500
    assert [message.to for message in mailoutbox] == [["ops@example.com"]]


def test_each_jobs_last_success_is_read_from_an_index_with_its_lock_row(synced):
    """/healthz, /metrics and check_jobs read each job's last success: the first entry of the runs'
    (job, status, finished_at) index (locks 0015), in the lock rows' query, not an aggregate of the
    job's whole history (on PostgreSQL a sequential scan of every run of every job)."""
    now = database_now()
    JobRun.objects.bulk_create(
        JobRun(job_name=JOB_NAME, tick=None, holder="h:1:a", token=n, started_at=now - timedelta(minutes=n))
        for n in range(2, 2001)
    )
    JobRun.objects.filter(token__gte=2).update(finished_at=F("started_at"), status=Outcome.SUCCEEDED)
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    with CaptureQueriesContext(connection) as queries:
        health = jobs_health(jobs=[JOB_NAME])

    assert health[JOB_NAME].last_success_at == JobRun.objects.order_by("-finished_at")[0].finished_at
    [query] = queries.captured_queries
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {'QUERY PLAN ' if connection.vendor == 'sqlite' else ''}{query['sql']}")
        plan = "\n".join(str(row) for row in cursor.fetchall())
    assert "jobrun_job_status_finished" in plan, plan
