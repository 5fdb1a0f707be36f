"""GET /metrics (issue 19, item 5): the Prometheus text format, parsed back with
prometheus_client's own parser; behind its bearer token (404 when unset); computed from the
database at scrape time in a bounded number of queries whatever the number of runs."""

from __future__ import annotations

import secrets
import subprocess
import sys
from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.db import connection
from django.test.utils import CaptureQueriesContext
from prometheus_client.parser import text_string_to_metric_families

from locks.contrib.alerts.models import Incident
from locks.lease import acquire
from locks.models import JobRun, Outcome, SyncLock, database_now, now_plus
from locks.operator import pause_job
from locks.runner import run_job
from locks.schedule import Schedule
from tests.conftest import project_env

TOKEN = secrets.token_urlsafe(32)
AUTH = {"HTTP_AUTHORIZATION": f"Bearer {TOKEN}"}
pytestmark = pytest.mark.django_db


@pytest.fixture
def enabled(settings):
    settings.LOCKS_METRICS_TOKEN = TOKEN


def scrape(client) -> dict:
    """{(metric name, frozenset of labels): value} of one scrape."""
    response = client.get("/metrics", **AUTH)
    assert response.status_code == 200, response.content
    assert response["Content-Type"].startswith("text/plain; version=")
    samples = {}
    for family in text_string_to_metric_families(response.content.decode()):
        for sample in family.samples:
            samples[(sample.name, frozenset(sample.labels.items()))] = sample.value
    return samples


def value(samples: dict, name: str, **labels) -> float:
    return samples[(name, frozenset(labels.items()))]


@pytest.mark.parametrize("method", ["get", "post"])
def test_404_without_the_token_setting(client, settings, method):
    settings.LOCKS_METRICS_TOKEN = ""
    assert getattr(client, method)("/metrics", **AUTH).status_code == 404


@pytest.mark.parametrize("header", [None, "Bearer", f"Bearer {TOKEN}x", f"Basic {TOKEN}"])
def test_401_for_a_missing_or_wrong_token(client, enabled, header):
    response = client.get("/metrics", **({"HTTP_AUTHORIZATION": header} if header else {}))
    assert response.status_code == 401
    assert response["WWW-Authenticate"] == 'Bearer realm="metrics"'
    assert b"locks_" not in response.content


def test_every_family_from_the_database(client, enabled, settings):
    settings.LOCKS_JOBS = {
        name: {**settings.LOCKS_JOBS[name], "schedule": "0 * * * *"} for name in ("write_slot", "record")
    }
    assert run_job(name="write_slot", force=True).outcome == "succeeded"
    run = JobRun.objects.get()
    JobRun.objects.filter(pk=run.pk).update(
        tick=Schedule("0 * * * *").previous(database_now(), 2)[1],  # the slot before this one
        started_at=now_plus(-timedelta(seconds=90)),
        finished_at=now_plus(-timedelta(seconds=60)),
    )
    acquire(job="record", tick=None, ttl=timedelta(minutes=5))  # held now
    pause_job(job="write_slot", by="cli:alice")
    Incident.objects.create(job_name="record", reason="missed", summary="s", opened_at=database_now())

    samples = scrape(client)

    success = JobRun.objects.get().finished_at.timestamp()
    assert value(samples, "locks_job_last_success_timestamp_seconds", job="write_slot") == pytest.approx(
        success
    )
    assert ("locks_job_last_success_timestamp_seconds", frozenset({("job", "record")})) not in samples
    assert value(samples, "locks_job_next_tick_timestamp_seconds", job="record") == (
        Schedule("0 * * * *").next_slot(database_now()).timestamp()
    )
    assert (
        value(samples, "locks_job_paused", job="write_slot"),
        value(samples, "locks_job_paused", job="record"),
    ) == (1, 0)
    assert value(samples, "locks_job_incident_open", job="record") == 1
    assert value(samples, "locks_job_incident_open", job="write_slot") == 0
    assert value(samples, "locks_job_runs", job="write_slot", status="succeeded") == 1
    assert value(samples, "locks_job_runs", job="write_slot", status="failed") == 0
    assert value(samples, "locks_lease_held", job="record") == 1
    assert value(samples, "locks_lease_held", job="write_slot") == 0
    assert value(samples, "locks_ticks", job="write_slot", outcome="succeeded") == 1
    # Its lock row was made just now: the 47 slots before are none of its (issue 27), not missed.
    assert value(samples, "locks_ticks", job="record", outcome="missed") == 0
    assert value(samples, "locks_ticks", job="record", outcome="pending") == 1
    assert abs(value(samples, "locks_clock_skew_seconds")) < 5
    # check_jobs is a registered job like the others (locks/registry.py).
    assert value(samples, "locks_job_paused", job="check_jobs") == 0


def test_the_last_duration_is_the_last_finished_run(client, enabled):
    run_job(name="record", force=True)
    SyncLock.objects.filter(job_name="record").update(
        last_started_at=now_plus(-timedelta(seconds=12)), last_finished_at=now_plus(-timedelta(seconds=2))
    )
    assert value(scrape(client), "locks_job_last_duration_seconds", job="record") == pytest.approx(
        10, abs=0.01
    )


@pytest.mark.parametrize("runs", [10, 1000])
def test_one_scrape_costs_the_same_queries_whatever_the_number_of_runs(client, enabled, runs):
    now = database_now()
    JobRun.objects.bulk_create(
        JobRun(
            job_name=("write_slot", "record", "refuse")[n % 3],
            tick=Schedule("*/5 * * * *").previous(now, 48)[n % 48],
            holder="h:1:a",
            token=n,
            started_at=now - timedelta(minutes=n % 240),
            finished_at=now - timedelta(minutes=n % 240) + timedelta(seconds=3),
            status=(Outcome.SUCCEEDED, Outcome.FAILED)[n % 2],
        )
        for n in range(runs)
    )
    with CaptureQueriesContext(connection) as queries:
        samples = scrape(client)
    # 9 before each job's last success was read with its lock row (status.jobs_health)
    assert len(queries) == 8, [query["sql"] for query in queries]
    assert (
        sum(
            value(samples, "locks_job_runs", job=job, status=status)
            for job in ("write_slot", "record", "refuse")
            for status in ("succeeded", "failed")
        )
        == runs
    )


def test_a_short_metrics_token_is_a_deploy_warning(settings):
    settings.LOCKS_METRICS_TOKEN = "short"
    [warning] = [m for m in run_checks(include_deployment_checks=True) if m.id == "locks.W004"]
    assert warning.msg == "LOCKS_METRICS_TOKEN is 5 characters long; use at least 32."


def test_a_collector_that_cannot_be_imported_is_refused(settings):
    settings.LOCKS_METRICS_COLLECTORS = ["tests.jobsapp.nope.collect"]
    assert "locks.E021" in {m.id for m in run_checks()}
    settings.LOCKS_METRICS_COLLECTORS = "tests.jobsapp.jobs.record"
    [error] = [m for m in run_checks() if m.id == "locks.E009"]
    assert (
        error.msg
        == "LOCKS_METRICS_COLLECTORS must be a list of dotted paths of functions, got 'tests.jobsapp.jobs.record'."
    )


def test_metrics_without_prometheus_client_is_refused_and_the_rest_of_the_app_imports(settings, monkeypatch):
    """prometheus_client is the extra [prometheus]: without it the app's URLs import (a process of
    their own), and a LOCKS_METRICS_TOKEN is refused (locks.E034), not a 500 at the first scrape."""
    code = "import sys; sys.modules['prometheus_client'] = None; import django; django.setup(); import locks.urls"
    done = subprocess.run(
        [sys.executable, "-c", code], env=project_env(), capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    monkeypatch.setitem(sys.modules, "prometheus_client", None)  # what an import of it sees when absent
    settings.LOCKS_METRICS_TOKEN = ""
    assert "locks.E034" not in {m.id for m in run_checks()}
    settings.LOCKS_METRICS_TOKEN = TOKEN
    [error] = [m for m in run_checks() if m.id == "locks.E034"]
    assert (
        error.msg
        == "LOCKS_METRICS_TOKEN is set, but prometheus_client, which /metrics needs, is not installed."
    )
    assert error.hint == "pip install 'django-tick-locks[prometheus]', or leave LOCKS_METRICS_TOKEN empty."
    monkeypatch.delitem(sys.modules, "prometheus_client")
    assert "locks.E034" not in {m.id for m in run_checks()}
