"""The lock's endpoints (locks.urls, included by config/urls.py) with the project's sync
behind them: the trigger runs it against the Codeforces stand-in, /healthz describes it at
the top level (LOCKS_HEALTHZ_JOB). How the endpoints behave for any job: tests/locks."""

import secrets

import pytest

from contests.models import Contest
from locks.models import JobRun, Outcome
from locks.registry import get_job
from locks.runner import run_job

TOKEN = secrets.token_urlsafe(32)
FIXTURE_CONTESTS = 1758


@pytest.fixture
def trigger(settings, standin, transactional_db):
    """The trigger enabled, the sync alone registered, the stand-in serving the real list."""
    settings.LOCKS_TRIGGER_TOKEN = TOKEN
    settings.LOCKS_JOBS = {"sync_contests": settings.LOCKS_JOBS["sync_contests"]}
    settings.LOCKS_CHECK_JOBS = False  # the locks app's own check_jobs: tests/locks/test_alerts.py
    settings.CODEFORCES_MAX_ATTEMPTS = 1
    return standin


def post(client, query: str = ""):
    return client.post(
        f"/api/jobs/sync_contests/run{query}", REMOTE_ADDR="192.0.2.1", HTTP_AUTHORIZATION=f"Bearer {TOKEN}"
    )


def test_the_trigger_runs_the_sync_for_the_tick_of_now(client, trigger):
    response = post(client)

    assert response.status_code == 200, response.content
    body = response.json()
    assert (body["job"], body["outcome"], body["forced"]) == ("sync_contests", "succeeded", False)
    assert body["tick"] == get_job("sync_contests").current_tick().isoformat()
    assert body["counts"]["fetched"] == body["counts"]["created"] == FIXTURE_CONTESTS
    assert trigger.calls == 1
    assert Contest.objects.count() == FIXTURE_CONTESTS


def test_502_when_codeforces_fails_and_nothing_is_written(client, trigger):
    trigger.status = 503
    response = post(client)
    assert response.status_code == 502
    body = response.json()
    assert body["outcome"] == "failed"
    assert "answered HTTP 503" in body["error"]
    assert trigger.calls == 1
    assert not Contest.objects.exists()
    assert JobRun.objects.get().status == Outcome.FAILED


def test_healthz_describes_the_sync_at_the_top_level(client, trigger):
    assert run_job(name="sync_contests", force=True).outcome == "succeeded"

    body = client.get("/healthz").json()

    assert (body["status"], body["job"], body["schedule"]) == ("ok", "sync_contests", "0 * * * *")
    assert body["last_success_at"] == JobRun.objects.get().finished_at.isoformat()
    assert list(body["jobs"]) == ["sync_contests"]
