"""`check --deploy` on the project's email and Codeforces settings (issue 21, item 9)."""

from __future__ import annotations

import pytest
from django.core.checks import run_checks

from contests.checks import SITE_URL_HINT, SMTP_BACKEND, W001, W002
from locks.models import JobRun, SyncLock
from tests.conftest import manage
from tests.test_deploy_settings import production_env

SMTP = {"EMAIL_BACKEND": SMTP_BACKEND, "EMAIL_HOST_USER": "", "EMAIL_HOST_PASSWORD": ""}


def _ids(**kwargs) -> set[str]:
    return {message.id for message in run_checks(include_deployment_checks=True, **kwargs)}


@pytest.mark.parametrize(
    ("email", "warned"),
    [
        ({"EMAIL_HOST_USER": "app", "EMAIL_HOST_PASSWORD": "pw"}, True),
        ({"EMAIL_HOST_PASSWORD": "pw"}, True),
        ({"EMAIL_HOST_USER": "app", "EMAIL_HOST_PASSWORD": "pw", "EMAIL_USE_TLS": True}, False),
        ({"EMAIL_HOST_USER": "app", "EMAIL_HOST_PASSWORD": "pw", "EMAIL_USE_SSL": True}, False),
        ({}, False),  # no credentials: nothing to read on the path
        (
            {
                "EMAIL_HOST_PASSWORD": "pw",
                "EMAIL_BACKEND": "django.core.mail.backends.console.EmailBackend",
            },
            False,
        ),
    ],
)
def test_smtp_credentials_without_tls_are_warned_about(settings, email, warned):
    for name, value in {**SMTP, "EMAIL_USE_TLS": False, "EMAIL_USE_SSL": False, **email}.items():
        setattr(settings, name, value)
    assert ("contests.W001" in _ids()) is warned
    assert "contests.W001" not in {m.id for m in run_checks()}  # a deploy check only


@pytest.mark.parametrize(
    ("url", "warned"),
    [
        ("http://127.0.0.1:8765/api", True),
        ("HTTP://mirror.example/api", True),
        ("https://codeforces.com/api", False),
    ],
)
def test_a_plain_http_codeforces_url_is_warned_about(settings, url, warned):
    settings.CODEFORCES_API_URL = url
    assert ("contests.W002" in _ids()) is warned


def test_check_deploy_names_both_in_a_real_process():
    env = production_env(
        EMAIL_URL="smtp://reminders%40example.com:pw@smtp.example.com:25",
        CODEFORCES_API_URL="http://cf-mirror.example/api",
    )
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=env)

    assert result.returncode == 1
    assert f"(contests.W001) {W001}" in result.stderr
    assert f"(contests.W002) {W002}" in result.stderr
    assert "pw@" not in result.stderr

    fixed = production_env(
        EMAIL_URL="smtp+tls://reminders%40example.com:pw@smtp.example.com:587",
        CODEFORCES_API_URL="https://cf-mirror.example/api",
    )
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=fixed)
    assert result.returncode == 0, result.stderr


def test_a_production_site_without_an_https_site_url_sends_no_reminder_and_stops_no_other_job(db_url):
    """Issue 28, item 4: every reminder's one-click unsubscribe link needs the site's https://
    address. `manage.py check` refuses without it, and so does every run of send_reminders (a
    failed run that claims nothing), while the other jobs go on: one job's setting never stops
    another job (as one impossible schedule stops only its own job)."""
    for url, said in [("", "and it is not set"), ("http://contests.example.com", "got 'http://")]:
        JobRun.objects.all().delete()
        SyncLock.objects.all().delete()  # each round a first run
        env = production_env(SITE_URL=url, DATABASE_URL=db_url)
        checked = manage("check", env=env)
        run = manage("send_reminders", env=env)
        other = manage("run_job", "check_jobs", env=env)

        assert checked.returncode == 1
        assert f"(contests.E010) SITE_URL must be this site's https:// address when DEBUG is off, {said}" in (
            checked.stderr
        )
        assert f"HINT: {SITE_URL_HINT}" in checked.stderr
        assert run.returncode == 1 and "(contests.E010)" in run.stderr, run.stderr
        assert "Traceback" not in checked.stderr + run.stderr
        refused = JobRun.objects.get(job_name="send_reminders")
        assert refused.status == "failed"
        assert refused.error.startswith("not sent: (contests.E010) SITE_URL must be"), refused.error
        assert other.returncode == 0 and "contests.E010" not in other.stderr, other.stderr
        assert JobRun.objects.get(job_name="check_jobs").status == "succeeded"

    fine = manage("check", env=production_env(DATABASE_URL=db_url))  # SITE_URL=https://contests.example.com
    assert fine.returncode == 0, fine.stderr
