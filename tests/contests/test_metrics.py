"""contests_reminders{state} on /metrics: the contests app's collector (LOCKS_METRICS_COLLECTORS),
beside the locks app's families, in the project's own settings."""

from __future__ import annotations

import secrets
from datetime import timedelta

import pytest
from django.conf import settings as project
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone
from prometheus_client.parser import text_string_to_metric_families

from tests.contests.reminder_data import make_contest, make_reminder, make_user

TOKEN = secrets.token_urlsafe(32)
pytestmark = pytest.mark.django_db


def test_the_project_registers_the_reminders_collector():
    assert project.LOCKS_METRICS_COLLECTORS == ["contests.metrics.reminder_metrics"]


@pytest.mark.parametrize("extra", [0, 100])
def test_reminders_by_delivery_state_in_one_query(client, settings, extra):
    settings.LOCKS_METRICS_TOKEN = TOKEN
    contest = make_contest(1, start=timedelta(hours=3))
    now = timezone.now()
    make_reminder(make_user("a"), contest, at=-timedelta(minutes=1), delivered_at=now)
    make_reminder(make_user("b"), contest, at=-timedelta(minutes=1), failed_at=now, last_error="no address")
    make_reminder(make_user("c"), contest, at=-timedelta(minutes=1), uncertain_at=now, last_error="timed out")
    make_reminder(make_user("d"), contest, at=-timedelta(minutes=1), uncertain_at=now, failed_at=now)
    for n in range(2 + extra):
        make_reminder(make_user(f"p{n}"), contest, at=timedelta(minutes=n + 1))

    with CaptureQueriesContext(connection) as queries:
        response = client.get("/metrics", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")

    assert response.status_code == 200
    families = {family.name: family for family in text_string_to_metric_families(response.content.decode())}
    reminders = {sample.labels["state"]: sample.value for sample in families["contests_reminders"].samples}
    # Each in one state, as the admin shows it: uncertain before failed.
    assert reminders == {"pending": 2 + extra, "delivered": 1, "uncertain": 2, "failed": 1}
    assert {"locks_job_paused", "locks_ticks"} <= set(families)
    assert len(queries) == 9  # the locks app's eight and this one, whatever the number of reminders
