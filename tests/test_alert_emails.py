"""check_jobs' alert emails over a real SMTP connection (issue 27, item 2): an answer lost after
DATA is uncertain and never re-sent by itself, a refused one fails the run and is sent by the next.
Here, not in tests/locks, because tests/locks uses no stand-in of this project's; the locks app is
the same."""

from __future__ import annotations

from datetime import timedelta

import pytest

from locks.contrib.alerts.models import Incident
from locks.models import JobRun, Outcome, SyncLock, database_now
from locks.runner import RunResult, run_job
from locks.schedule import Schedule
from tests.smtp_standin import smtp_standin

pytestmark = pytest.mark.django_db(transaction=True)
MINUTELY = "* * * * *"


@pytest.fixture(autouse=True)
def failing(settings):
    """A minutely job ``nightly`` whose last two slots failed, watched by check_jobs."""
    settings.LOCKS_JOBS = {
        **settings.LOCKS_JOBS,
        "nightly": {"schedule": MINUTELY, "callable": "contests.jobs.sync_contests"},
    }
    settings.ADMINS = [("On call", "oncall@example.com")]
    SyncLock.objects.create(job_name="nightly", created_at=database_now() - timedelta(minutes=2))
    for token, tick in enumerate(Schedule(MINUTELY).previous(database_now(), 3)[1:], start=1):
        JobRun.objects.create(
            job_name="nightly",
            tick=tick,
            holder="h:1:a",
            token=token,
            status=Outcome.FAILED,
            started_at=tick,
        )
    for name in set(settings.LOCKS_JOBS) - {"nightly", "check_jobs"}:  # the others: succeeded just now
        SyncLock.objects.create(job_name=name)


def check_jobs() -> RunResult:
    return run_job(name="check_jobs", force=True)


@pytest.fixture
def smtp(settings):
    with smtp_standin() as server:
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", server.port, 2
        yield server


def test_an_answer_lost_after_data_is_uncertain_fails_the_run_and_is_never_resent(smtp):
    smtp.drop_after_data.add("oncall@example.com")
    result = check_jobs()
    assert result.outcome == "failed_expected" and "is uncertain" in result.failure.error
    assert Incident.objects.get().opened_mail_state == "uncertain"
    assert smtp.received["oncall@example.com"] == 1
    smtp.drop_after_data.clear()
    assert check_jobs().outcome == "succeeded"
    assert smtp.received["oncall@example.com"] == 1  # not sent again by itself


def test_a_refused_alert_email_fails_the_run_and_the_next_run_sends_it(smtp):
    smtp.refused.add("oncall@example.com")
    assert check_jobs().outcome == "failed_expected"
    assert Incident.objects.get().opened_mail_state == ""  # unclaimed
    smtp.refused.clear()
    assert check_jobs().outcome == "succeeded"
    assert Incident.objects.get().opened_mail_state == "sent" and smtp.accepted["oncall@example.com"] == 1
