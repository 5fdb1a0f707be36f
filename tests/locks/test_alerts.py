"""check_jobs (issue 19, item 4): an incident per job that needs a human, one opening and one
recovery email (mail_admins), nothing in between, never for a paused job; run under its own
lease, so two replicas send each email once (file-based email backend, real processes)."""

from __future__ import annotations

import re
import secrets
import socket
import subprocess
import sys
import time
from datetime import timedelta
from email import message_from_string

import pytest
from django import get_version
from django.core import mail
from django.core.checks import run_checks
from django.db import connection

from locks.contrib.alerts.jobs import AlertNotSent
from locks.contrib.alerts.models import Incident
from locks.lease import FAILOVER_PAUSER
from locks.models import JobRun, Outcome, SyncLock, database_now, now_plus
from locks.operator import pause_job, resume_job
from locks.runner import run_job
from locks.schedule import Schedule
from tests.conftest import ROOT, project_env
from tests.locks.conftest import faketime_or_skip, schedulers, wait_for

pytestmark = pytest.mark.django_db(transaction=True)
MINUTELY = "* * * * *"
TOKEN = secrets.token_urlsafe(32)


@pytest.fixture(autouse=True)
def watched(settings):
    """``record`` (succeeds) and ``refuse`` (fails), every minute, beside check_jobs."""
    settings.LOCKS_JOBS = {
        name: {**settings.LOCKS_JOBS[name], "schedule": MINUTELY, "retry": {"delays": []}}
        for name in ("record", "refuse")
    }


def known_since(job: str, *, minutes: int) -> None:
    """The job's lock row, first seen ``minutes`` ago (what its earlier runs would have made)."""
    SyncLock.objects.update_or_create(
        job_name=job, defaults={"created_at": database_now() - timedelta(minutes=minutes)}
    )


def within_one_minute(seconds: float = 10) -> None:
    """When the database's minute ends within ``seconds``, wait for the next one: a test that writes
    a minutely job's history and then checks it sees the same slots (a minute's end between the two
    adds a slot with no run: "3 slots failed in a row", once in CI). The test takes some 0.3 s here."""
    now = database_now()
    left = 60 - now.second - now.microsecond / 1e6
    if left < seconds:
        time.sleep(left + 0.2)


def past_runs(job: str, statuses: list[str]) -> list:
    """One run of ``job`` per status on its latest slots whose chance is over, newest first."""
    ticks = Schedule(MINUTELY).previous(database_now(), len(statuses) + 1)[1:]
    for token, (tick, status) in enumerate(zip(ticks, statuses, strict=True), start=1):
        JobRun.objects.create(
            job_name=job,
            tick=tick,
            holder="h:1:a",
            token=token,
            status=status,
            started_at=tick,
            finished_at=tick + timedelta(seconds=1),
            error="boom" if status == Outcome.FAILED else "",
        )
    return ticks


def check() -> dict:
    result = run_job(name="check_jobs", force=True)
    assert result.outcome == "succeeded", result.describe()
    return result.stats


def test_two_failed_slots_open_one_incident_one_email_and_a_recovery_one_after_two_successes(mailoutbox):
    within_one_minute()
    known_since("refuse", minutes=2)
    known_since("record", minutes=30)
    past_runs("record", [Outcome.SUCCEEDED] * 3)
    ticks = past_runs("refuse", [Outcome.FAILED, Outcome.FAILED])
    SyncLock.objects.filter(job_name="refuse").update(last_error="Refused: nothing to record today")

    assert check() == {"jobs": 2, "opened": 1, "closed": 0, "open": 1, "emails": 1}
    incident = Incident.objects.get()
    assert (incident.job_name, incident.reason) == ("refuse", "failed")
    assert incident.summary.startswith("2 slots failed in a row, since ")
    [email] = mailoutbox
    assert email.subject.endswith("job refuse: failed") and email.to == ["oncall@example.com"]
    assert "Last error: Refused: nothing to record today" in email.body
    assert f"{ticks[0]:%Y-%m-%d %H:%M} UTC failed (1 attempt)" in email.body
    for _ in range(3):  # the next minutes: nothing new
        assert check()["emails"] == 0
    assert len(mailoutbox) == 1 and Incident.objects.count() == 1

    for token, tick in enumerate(ticks, start=9):  # the newest slot succeeded after all; then the one before
        JobRun.objects.create(
            job_name="refuse",
            tick=tick,
            holder="h:1:a",
            token=token,
            status=Outcome.SUCCEEDED,
            started_at=tick,
            finished_at=now_plus(timedelta(0)),
        )
        if token == 9:  # one success is not a recovery (alert_after_recoveries: 2)
            assert check() == {"jobs": 2, "opened": 0, "closed": 0, "open": 1, "emails": 0}
    assert check() == {"jobs": 2, "opened": 0, "closed": 1, "open": 0, "emails": 1}
    assert mailoutbox[1].subject.endswith("job refuse: recovered")
    assert "closed at" in mailoutbox[1].body
    assert check()["emails"] == 0 and len(mailoutbox) == 2
    assert Incident.objects.get().closed_mail_at is not None


def test_a_missed_slot_opens_an_incident_but_not_the_slots_before_the_job_was_first_seen(mailoutbox):
    assert check()["opened"] == 0  # first seen now: every earlier slot is before its time here
    assert set(SyncLock.objects.values_list("job_name", flat=True)) >= {"record", "refuse"}
    known_since("record", minutes=1)
    assert check()["opened"] == 0  # one missed slot: alert_after_failures is 2
    known_since("record", minutes=3)
    past_runs("refuse", [Outcome.SUCCEEDED])
    known_since("refuse", minutes=3)
    stats = check()
    assert (stats["opened"], stats["emails"]) == (
        1,
        1,
    )  # nobody ran record's last 3 slots; refuse's succeeded
    assert list(Incident.objects.values_list("job_name", "reason")) == [("record", "missed")]
    assert "3 slots missed in a row, since " in mailoutbox[0].body


def test_no_incident_for_a_paused_job_nor_for_the_slots_it_was_paused(mailoutbox):
    known_since("refuse", minutes=30)
    known_since("record", minutes=30)
    past_runs("record", [Outcome.SUCCEEDED] * 2)
    past_runs("refuse", [Outcome.FAILED] * 3)
    pause_job(job="refuse", by="cli:alice", note="known outage")
    assert check()["opened"] == 0
    resume_job(job="refuse", by="cli:alice")
    assert check()["opened"] == 0  # its failures came before the resume
    assert not Incident.objects.exists() and mailoutbox == []


def test_a_job_paused_by_a_database_failover_opens_an_incident_naming_it(mailoutbox):
    """Issue 26: on_failover "pause" stops the job for an operator to decide; check_jobs says so
    once (an operator's own pause opens none); the operator's resume ends it (its slots succeeded)."""
    known_since("refuse", minutes=30)
    known_since("record", minutes=30)
    past_runs("refuse", [Outcome.SUCCEEDED] * 2)
    past_runs("record", [Outcome.SUCCEEDED] * 2)
    note = "paused on a database failover: the database failed over since token 4 was granted on timeline 1"
    pause_job(job="refuse", by=FAILOVER_PAUSER, note=note)
    pause_job(job="record", by="cli:alice", note="known outage")

    assert check()["opened"] == 1
    assert check()["opened"] == 0  # once: while it stays paused, nothing more
    incident = Incident.objects.get()
    assert (incident.job_name, incident.reason, incident.summary) == ("refuse", "failover", note)
    assert len(mailoutbox) == 1 and note in mailoutbox[0].body
    resume_job(job="refuse", by="cli:alice")
    assert check()["closed"] == 1


def test_no_success_for_alert_after_seconds_opens_a_stale_incident(settings, mailoutbox):
    settings.LOCKS_JOBS["record"]["alert_after"] = 60
    known_since("record", minutes=30)
    known_since("refuse", minutes=30)
    past_runs("refuse", [Outcome.SUCCEEDED])
    ticks = past_runs("record", [Outcome.SUCCEEDED])
    JobRun.objects.filter(job_name="record").update(finished_at=now_plus(-timedelta(minutes=2)))
    JobRun.objects.create(  # running now, lease in force: the slot is not settled
        job_name="record",
        tick=ticks[0] + timedelta(minutes=1),
        holder="h:1:a",
        token=2,
        status=Outcome.RUNNING,
        started_at=ticks[0],
    )
    check()
    incident = Incident.objects.get(job_name="record")
    assert incident.reason == "stale" and incident.summary.startswith("no success for more than 0:01:00")


def test_an_email_the_server_refuses_is_unclaimed_and_sent_by_the_next_run(settings, mailoutbox):
    known_since("refuse", minutes=30)
    known_since("record", minutes=30)
    past_runs("record", [Outcome.SUCCEEDED])
    past_runs("refuse", [Outcome.FAILED, Outcome.FAILED])
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        settings.EMAIL_PORT = closed.getsockname()[1]
    settings.EMAIL_BACKEND, settings.EMAIL_HOST, settings.EMAIL_TIMEOUT = (
        "django.core.mail.backends.smtp.EmailBackend",
        "127.0.0.1",
        2,
    )
    failed = run_job(name="check_jobs", force=True)
    # Its incidents were written; the email was not: the run failed (issue 27), so the alert
    # channel's breakage shows in the ledger, /healthz and /metrics.
    assert failed.outcome == "failed_expected" and isinstance(failed.failure.exception, AlertNotSent)
    assert failed.failure.error.startswith("could not email ADMINS about refuse: ConnectionRefusedError")
    assert JobRun.objects.filter(job_name="check_jobs").get().status == Outcome.FAILED
    incident = Incident.objects.get()
    assert (incident.opened_mail_at, incident.opened_mail_state) == (None, "")  # unclaimed
    settings.EMAIL_BACKEND = "django.core.mail.backends.locmem.EmailBackend"
    assert check()["emails"] == 1 and len(mailoutbox) == 1


@pytest.mark.skipif(not hasattr(mail, "mailers"), reason=f"MAILERS is Django 6.1's (this is {get_version()})")
def test_on_django_61_the_alert_goes_to_the_default_mailer_of_mailers(settings, mailoutbox, tmp_path):
    """Not to EMAIL_BACKEND (locmem here), which Django 6.1 refuses to read once MAILERS is set."""
    known_since("refuse", minutes=30)
    past_runs("refuse", [Outcome.FAILED, Outcome.FAILED])
    settings.ADMINS = ["ops@example.com"]
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        smtp = {"host": "127.0.0.1", "port": closed.getsockname()[1], "timeout": 2}
    settings.MAILERS = {
        "default": {"BACKEND": "django.core.mail.backends.smtp.EmailBackend", "OPTIONS": smtp}
    }
    failed = run_job(name="check_jobs", force=True)
    assert failed.failure.error.startswith("could not email ADMINS about refuse: ConnectionRefusedError")
    settings.MAILERS = {
        "default": {
            "BACKEND": "django.core.mail.backends.filebased.EmailBackend",
            "OPTIONS": {"file_path": tmp_path},
        }
    }
    assert run_job(name="check_jobs", force=True).outcome == "succeeded"
    [written] = tmp_path.iterdir()
    assert "To: ops@example.com" in written.read_text() and mailoutbox == []


def test_the_alert_keys_are_checked(settings):
    settings.LOCKS_JOBS = {
        "a": {"schedule": MINUTELY, "callable": "tests.jobsapp.jobs.record", "alert_after_failures": 0},
        "b": {"schedule": MINUTELY, "callable": "tests.jobsapp.jobs.record", "alert_after": "1h"},
    }
    messages = {m.id: m.msg for m in run_checks() if m.id in {"locks.E030", "locks.E031"}}
    assert messages == {
        "locks.E030": "LOCKS_JOBS['a']: alert_after_failures must be a positive whole number, got 0.",
        "locks.E031": "LOCKS_JOBS['b']: alert_after must be a positive whole number of seconds, got '1h'.",
    }


def _messages(directory) -> list:
    """Every email the file-based backend wrote (one file per connection, messages split by a rule)."""
    found = []
    for path in sorted(directory.iterdir()):
        for chunk in path.read_text().split("-" * 79):
            if chunk.strip():
                found.append(message_from_string(chunk.strip()))
    return found


@pytest.mark.slow
def test_two_replicas_over_a_failing_job_send_one_opening_and_one_recovery_email(db_url, tmp_path):
    flaky, mail = tmp_path / "fail", tmp_path / "mail"
    flaky.touch()
    env = project_env(
        DATABASE_URL=db_url,
        FLAKY_FILE=str(flaky),
        FLAKY_SCHEDULE="* * * * * */2",
        CHECK_JOBS_SCHEDULE="* * * * * */3",
        HOSTPROJECT_JOBS="flaky check_jobs",
        HOSTPROJECT_MAIL_DIR=str(mail),
    )
    logs = [tmp_path / f"replica-{n}.log" for n in range(2)]
    with schedulers(env, logs, "flaky", "check_jobs") as replicas:
        opened = Incident.objects.filter(job_name="flaky", opened_mail_at__isnull=False)
        wait_for(opened.exists, timeout=90, what="the opening email")
        flaky.unlink()  # the job recovers
        closed = Incident.objects.filter(job_name="flaky", closed_mail_at__isnull=False)
        wait_for(closed.exists, timeout=90, what="the recovery email")
        after = closed.get().closed_mail_at
        later = JobRun.objects.filter(job_name="check_jobs", status=Outcome.SUCCEEDED, started_at__gt=after)
        wait_for(lambda: later.count() >= 3, timeout=60, what="three more check_jobs runs")

    texts = [log.read_text() for log in logs]
    assert [proc.returncode for proc in replicas] == [0, 0], texts
    assert all("Traceback" not in text for text in texts), texts
    # Both asked for it: each ran it (its run's log line names the holder) or lost the tick's claim
    # to the other (claim before spawn: whichever wakes first wins, so one copy may win every tick).
    holders = set(JobRun.objects.filter(job_name="check_jobs").values_list("holder", flat=True))
    lost = re.compile(r"job=check_jobs tick=\S+ holder=\S+ outcome=skipped reason=claimed by another copy")
    assert all(any(f"holder={h}" in text for h in holders) or lost.search(text) for text in texts), texts
    subjects = sorted(message["Subject"] for message in _messages(mail))
    assert subjects == ["[Django] job flaky: failed", "[Django] job flaky: recovered"], subjects
    assert Incident.objects.count() == 1


def test_an_open_incident_is_in_the_healthz_details_only(client, settings):
    settings.LOCKS_HEALTHZ_TOKEN = TOKEN
    known_since("refuse", minutes=30)
    known_since("record", minutes=30)
    past_runs("refuse", [Outcome.FAILED, Outcome.FAILED])
    past_runs("record", [Outcome.SUCCEEDED])
    check()

    trusted = client.get("/healthz", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").json()
    incident = trusted["jobs"]["refuse"]["incident"]
    assert (incident["reason"], incident["email_sent"]) == ("failed", True)
    assert incident["opened_at"] == Incident.objects.get().opened_at.isoformat()
    assert trusted["jobs"]["record"]["incident"] is None
    assert "incident" not in client.get("/healthz").json()["jobs"]["refuse"]  # a detail


def test_a_job_first_seen_by_a_host_three_minutes_slow_has_no_slot_before_it_judged(db_url):
    """Issue 35, item 7: the lock row's ``created_at`` was the host's clock, so check_jobs on a host
    3 minutes slow judged 3 minutely slots from before the job was first seen: missed, an incident.
    It is the database's clock now (SQLite's is each process's own, faked with it: PostgreSQL only)."""
    if connection.vendor != "postgresql":
        pytest.skip("PostgreSQL only: SQLite's clock is the process's own, and faketime fakes it too")
    env = project_env(
        DATABASE_URL=db_url, HOSTPROJECT_JOBS="write_slot check_jobs", WRITE_SLOT_SCHEDULE=MINUTELY
    )
    slow = [faketime_or_skip(), "-f", "-3m", sys.executable, str(ROOT / "manage.py")]

    ran = subprocess.run(
        [*slow, "run_job", "check_jobs"], env=env, capture_output=True, text=True, timeout=120
    )

    assert ran.returncode == 0, ran.stderr
    assert abs(database_now() - SyncLock.objects.get(job_name="write_slot").created_at) < timedelta(
        seconds=60
    )
    assert not Incident.objects.exists(), list(Incident.objects.values("job_name", "reason", "summary"))
