"""Signals that never lie (issue 27): an impossible schedule is one job's failure, alerts with a
recipient delivered like reminders, hysteresis, paused is not stale, the trigger catches up, the
ledger starts when the job does, and job names cron and the CLI can carry."""

from __future__ import annotations

import secrets
import subprocess
import sys
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import CommandError

from locks.checks import CHECK_TAG
from locks.contrib.alerts.jobs import CLOSE, decide
from locks.contrib.alerts.models import Incident
from locks.models import JobRun, Outcome, SyncLock, database_now, now_plus
from locks.operator import pause_job
from locks.registry import Job, get_job
from locks.runner import RunResult, run_job
from locks.schedule import Schedule
from locks.scheduler import Scheduler
from locks.status import build_ledger, job_ledgers
from tests.conftest import ROOT, project_env
from tests.locks.conftest import register

pytestmark = pytest.mark.django_db(transaction=True)
MINUTELY, HOURLY, NEVER = "* * * * *", "0 * * * *", "0 0 31 2 *"
TOKEN = secrets.token_urlsafe(32)


def known_since(job: str, *, minutes: int) -> None:
    SyncLock.objects.update_or_create(
        job_name=job, defaults={"created_at": database_now() - timedelta(minutes=minutes)}
    )


def past_runs(job: str, statuses: list[str], *, schedule: str = MINUTELY) -> list[datetime]:
    """One run per status on the job's latest slots whose chance is over, newest first."""
    ticks = Schedule(schedule).previous(database_now(), len(statuses) + 1)[1:]
    for token, (tick, status) in enumerate(zip(ticks, statuses, strict=True), start=1):
        JobRun.objects.create(
            job_name=job,
            tick=tick,
            holder="h:1:a",
            token=token,
            status=status,
            started_at=tick,
            finished_at=tick + timedelta(seconds=1),
        )
    return ticks


@pytest.fixture
def minutely(settings):
    """``record`` and ``refuse`` every minute, one attempt per slot, beside check_jobs."""
    settings.LOCKS_JOBS = {
        name: {**settings.LOCKS_JOBS[name], "schedule": MINUTELY, "retry": {"delays": []}}
        for name in ("record", "refuse")
    }


def check_jobs() -> RunResult:
    return run_job(name="check_jobs", force=True)


# --- 1. a schedule checked for what it does ---------------------------------------------


def test_a_schedule_without_a_slot_in_five_years_is_a_check_error_naming_the_job(settings):
    register(settings, feb31={"schedule": NEVER, "callable": "tests.jobsapp.jobs.record"})
    [problem] = [m for m in run_checks() if m.id == "locks.E026"]
    assert problem.msg.startswith(
        "LOCKS_JOBS['feb31']: schedule '0 0 31 2 *' has no slot in the next 5 years"
    )
    assert "February 31st" in problem.hint
    # Not among the checks each run makes (run_job, run_scheduler): the other jobs still run.
    assert [m.id for m in run_checks(tags=[CHECK_TAG])] == []


def test_a_healthz_job_that_is_not_registered_is_a_check_warning(settings):
    assert [m.id for m in run_checks() if m.id == "locks.W008"] == []  # write_slot is registered
    settings.LOCKS_HEALTHZ_JOB = "sync_contest"
    [problem] = [m for m in run_checks() if m.id == "locks.W008"]
    assert problem.msg.startswith("LOCKS_HEALTHZ_JOB is 'sync_contest', which is not a job of LOCKS_JOBS (")
    assert "write_slot" in problem.msg
    assert [m.id for m in run_checks(tags=[CHECK_TAG])] == []  # the runs go on


def test_an_impossible_schedule_beside_a_good_one_fails_alone(settings, admin_client, client, caplog):
    settings.LOCKS_HEALTHZ_TOKEN = settings.LOCKS_METRICS_TOKEN = TOKEN
    register(settings, feb31={"schedule": NEVER, "callable": "tests.jobsapp.jobs.record"})
    good = Job("good", Schedule("0 * * * *"), "tests.jobsapp.jobs.record", timedelta(seconds=60), None, ())
    bad = Job("feb31", Schedule(NEVER), "tests.jobsapp.jobs.record", timedelta(seconds=60), None, ())
    asked, now = [], datetime(2026, 12, 2, 10, 0, tzinfo=UTC)

    def run(*, name, due):
        asked.append((name, due))
        return RunResult(job=name, tick=due, holder="h", outcome="succeeded")

    scheduler = Scheduler(jobs=[bad, good], now=lambda: now, run=run, paused=lambda name: False)
    scheduler.step()
    scheduler.step()
    assert asked == [("good", now)] and scheduler.next_wake() == now + timedelta(minutes=1)  # MAX_SLEEP
    broken = [
        r.message for r in caplog.records if r.message.startswith("scheduler: job=feb31 outcome=failed")
    ]
    assert len(broken) == 1, broken  # once, not at every wake
    assert "has no slot that can be computed (CroniterBadDateError" in broken[0]

    health = client.get("/healthz", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert health.status_code == 503  # a job that cannot run is unhealthy; the answer still comes
    job = health.json()["jobs"]["feb31"]
    assert job["status"] == "error" and "CroniterBadDateError" in job["error"]
    assert health.json()["jobs"]["record"]["status"] in {"ok", "stale"}
    metrics = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert metrics.status_code == 200 and b'locks_job_paused{job="feb31"} 0.0' in metrics.content
    assert b'locks_job_next_tick_timestamp_seconds{job="feb31"}' not in metrics.content
    page = admin_client.get("/admin/locks/synclock/")
    assert (
        page.status_code == 200
        and b"feb31" in page.content
        and b"no slot that can be computed" in page.content
    )
    assert job_ledgers(jobs=[get_job("feb31")])["feb31"].slots == []
    # Paused, alone: its ledger (so /metrics) still reads its lock row's pause.
    pause_job(job="feb31", by="cli:test", note="")
    ledger = job_ledgers(jobs=[get_job("feb31")])["feb31"]
    assert (ledger.paused, ledger.slots) == (True, [])
    assert (
        b'locks_job_paused{job="feb31"} 1.0'
        in client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content
    )


# --- 2. alerts with a recipient, delivered like reminders --------------------------------


def test_check_jobs_without_admins_is_a_deploy_warning_only(settings):
    settings.ADMINS = []
    assert "locks.W005" not in {m.id for m in run_checks()}  # the development default stays quiet
    [warning] = [m for m in run_checks(include_deployment_checks=True) if m.id == "locks.W005"]
    assert "ADMINS" in warning.hint
    settings.LOCKS_CHECK_JOBS = False
    assert "locks.W005" not in {m.id for m in run_checks(include_deployment_checks=True)}


def test_an_incident_with_nobody_to_tell_says_no_recipient_never_sent(settings, minutely, client, mailoutbox):
    settings.ADMINS, settings.LOCKS_HEALTHZ_TOKEN = [], TOKEN
    known_since("refuse", minutes=2)
    past_runs("refuse", [Outcome.FAILED, Outcome.FAILED])
    assert check_jobs().outcome == "succeeded"
    incident = Incident.objects.get()
    assert (incident.opened_mail_state, mailoutbox) == ("no recipient", [])
    shown = client.get("/healthz", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").json()["jobs"]["refuse"]["incident"]
    assert (shown["email"], shown["email_sent"]) == ("no recipient", False)


def test_a_crash_between_claim_and_send_is_sent_once_its_claim_expires(minutely, mailoutbox):
    known_since("refuse", minutes=2)
    past_runs("refuse", [Outcome.FAILED, Outcome.FAILED])
    Incident.objects.create(  # a run claimed its opening email, then died before sending it
        job_name="refuse",
        reason="failed",
        summary="s",
        opened_at=database_now(),
        opened_mail_state="claimed",
        opened_mail_claimed_until=now_plus(timedelta(minutes=4)),
    )
    assert check_jobs().stats["emails"] == 0 and mailoutbox == []  # still claimed: not sent twice
    Incident.objects.update(opened_mail_claimed_until=now_plus(-timedelta(seconds=1)))
    assert check_jobs().stats["emails"] == 1
    assert len(mailoutbox) == 1 and Incident.objects.get().opened_mail_state == "sent"
    assert check_jobs().stats["emails"] == 0 and len(mailoutbox) == 1


# --- 3. hysteresis --------------------------------------------------------------------------


def test_pausing_a_failing_job_sends_no_recovered(minutely, mailoutbox):
    known_since("refuse", minutes=2)
    past_runs("refuse", [Outcome.FAILED, Outcome.FAILED])
    assert check_jobs().stats["opened"] == 1
    pause_job(job="refuse", by="cli:alice")
    # The slots whose chance passes while it is paused are `paused`: they close nothing.
    SyncLock.objects.filter(job_name="refuse").update(paused_at=now_plus(-timedelta(minutes=5)))
    for _ in range(3):
        assert check_jobs().stats["closed"] == 0
    assert Incident.objects.open().count() == 1
    assert [m.subject for m in mailoutbox] == ["[Django] job refuse: failed"]


def test_a_job_flapping_every_minute_for_an_hour_sends_one_opening_and_one_recovery():
    """60 minutes of fake time: the ledger at each minute, check_jobs' decision on it."""
    job = Job("flappy", Schedule(MINUTELY), "tests.jobsapp.jobs.record", timedelta(seconds=60), None, ())
    start = datetime(2026, 12, 2, 10, tzinfo=UTC)
    outcome = {
        start + timedelta(minutes=m): Outcome.FAILED if m % 2 or m < 4 else Outcome.SUCCEEDED
        for m in range(60)
    }
    outcome.update(
        {start + timedelta(minutes=m): Outcome.SUCCEEDED for m in range(60, 63)}
    )  # then it recovers
    emails, incident_open = [], False
    for minute in range(1, 64):
        now = start + timedelta(minutes=minute, seconds=30)
        ticks = Schedule(MINUTELY).previous(now, 48)
        runs = {
            tick: [{"tick": tick, "token": 1, "status": status, "holder": "h", "started_at": tick}]
            for tick, status in outcome.items()
            if tick < now - timedelta(minutes=1) or tick in ticks[1:]
        }
        ledger = build_ledger(job, ticks=ticks, runs=runs, lock={"created_at": start}, pauses=[], db_now=now)
        action = decide(
            job, ledger, incident_open=incident_open, paused=False, since=start, last_success=None
        )
        if action == CLOSE:
            emails.append("recovered")
            incident_open = False
        elif action is not None and action.reason != "stale":
            emails.append(action.reason)
            incident_open = True
    assert emails == ["failed", "recovered"]


# --- 4. paused is not stale -----------------------------------------------------------------


def test_a_paused_job_is_paused_on_healthz_and_left_out_of_its_status(settings, client):
    settings.LOCKS_JOBS = {"record": settings.LOCKS_JOBS["record"]}
    settings.LOCKS_CHECK_JOBS, settings.LOCKS_HEALTHZ_JOB = False, ""
    known_since("record", minutes=60)
    pause_job(job="record", by="cli:alice", note="vendor outage")
    response = client.get("/healthz")
    assert response.status_code == 200, response.json()
    assert response.json()["jobs"]["record"]["status"] == "paused"
    settings.LOCKS_HEALTHZ_PAUSED_UNHEALTHY = True
    assert client.get("/healthz").status_code == 503


# --- 5. a slot lost to a pause is paused ----------------------------------------------------


def test_a_slot_whose_time_came_while_paused_is_paused_not_missed():
    job = Job("h", Schedule(HOURLY), "tests.jobsapp.jobs.record", timedelta(seconds=60), None, ())
    now = datetime(2026, 12, 2, 11, 30, tzinfo=UTC)
    ticks = Schedule(HOURLY).previous(now, 3)  # 11:00, 10:00, 09:00
    pauses = [
        (ticks[1] - timedelta(minutes=1), ticks[1] + timedelta(minutes=30))
    ]  # resumed at 10:30: cron never asked again
    ledger = build_ledger(job, ticks=ticks, runs={}, lock={}, pauses=pauses, db_now=now)
    assert [slot.outcome for slot in ledger.slots] == ["pending", "paused", "missed"]


# --- 6. the trigger runs what run_job NAME runs --------------------------------------------


def test_the_trigger_after_a_three_slot_outage_runs_three_slots_oldest_first(settings, client):
    settings.LOCKS_TRIGGER_TOKEN = TOKEN
    register(
        settings,
        hourly={
            "schedule": HOURLY,
            "callable": "tests.jobsapp.jobs.write_slot",
            "ttl": 60,
            "catch_up": "all",
        },
    )
    current = get_job("hourly").current_tick()
    SyncLock.objects.create(job_name="hourly", tick=current - timedelta(hours=3), tick_done=True)
    response = client.post(
        "/api/jobs/hourly/run", REMOTE_ADDR="192.0.2.1", HTTP_AUTHORIZATION=f"Bearer {TOKEN}"
    )
    assert response.status_code == 200, response.json()
    body = response.json()
    expected = [(current - timedelta(hours=h)).isoformat() for h in (2, 1, 0)]
    assert [(run["tick"], run["outcome"]) for run in body["runs"]] == [
        (tick, "succeeded") for tick in expected
    ]
    assert body["tick"] == expected[-1] and body["behind"] is False


# --- 7. the ledger starts when the job does ---------------------------------------------------


def test_the_ledger_starts_with_the_lock_row_and_so_does_metrics(settings, client, minutely):
    settings.LOCKS_METRICS_TOKEN = TOKEN
    register(
        settings, hourly={"schedule": HOURLY, "callable": "tests.jobsapp.jobs.record", "catch_up": "all"}
    )
    current = Schedule(HOURLY).previous(database_now(), 1)[0]
    SyncLock.objects.create(
        job_name="hourly", created_at=current - timedelta(hours=3) + timedelta(seconds=30)
    )
    ledger = job_ledgers(jobs=[get_job("hourly")])["hourly"]
    assert len(ledger.slots) == 4  # 3 h ago (current then) … now; not the 48 of LOCKS_LEDGER_SLOTS
    assert "pending" in {slot.outcome for slot in ledger.slots}
    metrics = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").content.decode()
    counts = {
        line.split('outcome="')[1].split('"')[0]: float(line.split()[-1])
        for line in metrics.splitlines()
        if line.startswith('locks_ticks{job="hourly"')
    }
    assert sum(counts.values()) == 4


def test_ledger_length_is_capped_at_10000(settings, db_url):
    settings.LOCKS_LEDGER_SLOTS = 10_001
    [error] = [m for m in run_checks() if m.id == "locks.E008"]
    assert error.msg == "LOCKS_LEDGER_SLOTS must be at most 10000, got 10001."
    settings.LOCKS_LEDGER_SLOTS = 48
    with pytest.raises(CommandError, match="at most 10000"):
        call_command("locks", "ticks", "record", "--last", "10001", stdout=StringIO())
    command = [sys.executable, str(ROOT / "manage.py"), "locks", "ticks", "record", "--last", "10001"]
    env = project_env(DATABASE_URL=db_url, DJANGO_SETTINGS_MODULE="tests.hostproject.settings")
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "at most 10000" in done.stderr, done.stderr


# --- 8. job names -----------------------------------------------------------------------------


@pytest.mark.parametrize("name", ["-v", "--force", "a b", "a;b", "a$b", "a|b", "tab\tjob"])
def test_names_cron_and_the_cli_cannot_carry_are_check_errors(settings, name):
    settings.LOCKS_JOBS = {name: {"schedule": MINUTELY, "callable": "tests.jobsapp.jobs.record"}}
    [error] = [m for m in run_checks() if m.id == "locks.E016"]
    assert error.msg == f"LOCKS_JOBS: {name!r} is not a valid job name."
    assert "not starting with '-'" in error.hint


def test_the_admin_says_a_pause_has_an_open_incident(minutely, admin_client):
    known_since("refuse", minutes=2)
    past_runs("refuse", [Outcome.FAILED, Outcome.FAILED])
    check_jobs()
    pause_job(job="refuse", by="cli:alice")
    page = admin_client.get("/admin/locks/synclock/").content.decode()
    assert "paused with an incident open since" in page
