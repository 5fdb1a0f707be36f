"""Production settings: `check --deploy` clean, a missing secret refused, gunicorn serving it all."""

from __future__ import annotations

import os
import runpy
import secrets
import subprocess
import sys

import pytest
import requests
from django.core.checks import run_checks
from django.core.exceptions import ImproperlyConfigured

from contests.models import Contest
from tests.conftest import ROOT, gunicorn, manage, project_env

SETTINGS = str(ROOT / "config" / "settings.py")
TOKEN = secrets.token_urlsafe(32)
# The variables this file controls, whatever the caller's shell has.
OURS = ("DJANGO_", "LOCKS_", "SYNC_TRIGGER_", "HEALTHZ_TOKEN")


def production_env(**extra: str) -> dict[str, str]:
    """The minimal production environment docs/deployment.md documents."""
    env = {name: value for name, value in project_env().items() if not name.startswith(OURS)}
    env.update(
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY=secrets.token_urlsafe(50),
        DJANGO_ALLOWED_HOSTS="contests.example.com",
        SITE_URL="https://contests.example.com",
        LOCKS_TRIGGER_TOKEN=TOKEN,
        DJANGO_ADMINS="oncall@example.com",  # check_jobs' alerts need a recipient (locks.W005)
    )
    env.update(extra)
    return env


def load_settings(monkeypatch, **env: str) -> dict:
    """Evaluate config/settings.py afresh under ``env`` (in this process, no Django reload)."""
    for name in [name for name in os.environ if name.startswith(OURS)]:
        monkeypatch.delenv(name)
    for name, value in env.items():
        monkeypatch.setenv(name, value)
    return runpy.run_path(SETTINGS)


# --- the settings themselves ---------------------------------------------------


def test_strict_by_default_when_debug_is_off(monkeypatch):
    ns = load_settings(monkeypatch, DJANGO_DEBUG="0", DJANGO_SECRET_KEY="x" * 60)
    assert ns["DEBUG"] is False
    assert ns["SECURE_SSL_REDIRECT"] is True
    assert ns["SECURE_HSTS_SECONDS"] == 31_536_000
    assert ns["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is True
    assert ns["SECURE_HSTS_PRELOAD"] is True
    assert ns["SESSION_COOKIE_SECURE"] is True
    assert ns["CSRF_COOKIE_SECURE"] is True
    assert ns["SECURE_PROXY_SSL_HEADER"] is None  # opt-in only
    assert ns["ALLOWED_HOSTS"] == []
    # Left to the locks app's defaults (locks/conf.py): 0 proxies, the trigger disabled.
    assert not {"LOCKS_TRUSTED_PROXY_COUNT", "LOCKS_TRIGGER_TOKEN", "LOCKS_HEALTHZ_TOKEN"} & set(ns)
    assert "whitenoise.middleware.WhiteNoiseMiddleware" in ns["MIDDLEWARE"]


def test_relaxed_for_local_development(monkeypatch):
    ns = load_settings(monkeypatch, DJANGO_DEBUG="1")
    assert ns["DEBUG"] is True
    assert ns["SECURE_SSL_REDIRECT"] is False
    assert ns["SECURE_HSTS_SECONDS"] == 0
    assert ns["SESSION_COOKIE_SECURE"] is False


def test_every_switch_follows_the_environment(monkeypatch, tmp_path):
    ns = load_settings(
        monkeypatch,
        DJANGO_DEBUG="0",
        DJANGO_SECRET_KEY="x" * 60,
        DJANGO_SECURE_SSL_REDIRECT="0",
        DJANGO_SECURE_PROXY_SSL_HEADER="1",
        DJANGO_SECURE_HSTS_SECONDS="60",
        DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS="no",
        DJANGO_SECURE_HSTS_PRELOAD="false",
        DJANGO_SECURE_COOKIES="off",
        DJANGO_CSRF_TRUSTED_ORIGINS="https://contests.example.com, https://admin.example.com",
        DJANGO_SILENCED_SYSTEM_CHECKS="security.W008",
        DJANGO_STATIC_ROOT=str(tmp_path),
        LOCKS_TRUSTED_PROXY_COUNT="2",
        LOCKS_TRIGGER_TOKEN=TOKEN,
        LOCKS_TRIGGER_RATE_WINDOW="30",
    )
    assert ns["SECURE_SSL_REDIRECT"] is False
    assert ns["SECURE_PROXY_SSL_HEADER"] == ("HTTP_X_FORWARDED_PROTO", "https")
    assert ns["SECURE_HSTS_SECONDS"] == 60
    assert ns["SECURE_HSTS_INCLUDE_SUBDOMAINS"] is False
    assert ns["SECURE_HSTS_PRELOAD"] is False
    assert (ns["SESSION_COOKIE_SECURE"], ns["CSRF_COOKIE_SECURE"]) == (False, False)
    assert ns["CSRF_TRUSTED_ORIGINS"] == ["https://contests.example.com", "https://admin.example.com"]
    assert ns["SILENCED_SYSTEM_CHECKS"] == ["security.W008"]
    assert ns["STATIC_ROOT"] == tmp_path
    assert ns["LOCKS_TRUSTED_PROXY_COUNT"] == 2
    assert ns["LOCKS_TRIGGER_TOKEN"] == TOKEN
    assert ns["LOCKS_TRIGGER_RATE_WINDOW"] == 30


def test_the_locks_defaults_come_from_the_app(settings):
    """config/settings.py sets no LOCKS_* default of its own: unset, each is locks/conf.py's."""
    ns = runpy.run_path(SETTINGS)
    assert not {"LOCKS_DEFAULT_TTL", "LOCKS_TICK_WINDOW", "LOCKS_TRIGGER_RATE_WINDOW"} & set(ns)
    assert (settings.LOCKS_DEFAULT_TTL, settings.LOCKS_TICK_WINDOW, settings.LOCKS_TRIGGER_RATE_WINDOW) == (
        300,
        300,
        10,
    )
    assert (settings.LOCKS_TRUSTED_PROXY_COUNT, settings.LOCKS_TRIGGER_TOKEN) == (0, "")


# --- the old names of the trigger's and /healthz's variables: one more release -------------

RENAMED = [
    ("SYNC_TRIGGER_TOKEN", "LOCKS_TRIGGER_TOKEN", TOKEN, TOKEN),
    ("SYNC_TRIGGER_RATE_WINDOW", "LOCKS_TRIGGER_RATE_WINDOW", "30", 30),
    ("HEALTHZ_TOKEN", "LOCKS_HEALTHZ_TOKEN", TOKEN, TOKEN),
    ("DJANGO_TRUSTED_PROXY_COUNT", "LOCKS_TRUSTED_PROXY_COUNT", "2", 2),
]


@pytest.mark.parametrize(("old", "new", "value", "setting"), RENAMED)
def test_an_old_name_still_works_with_a_future_warning(monkeypatch, old, new, value, setting):
    with pytest.warns(FutureWarning) as warned:
        ns = load_settings(monkeypatch, DJANGO_DEBUG="1", **{old: value})
    assert ns[new] == setting
    assert [str(w.message) for w in warned] == [
        f"{old} is deprecated: rename it {new} (the old name stops working in the next release)"
    ]


@pytest.mark.parametrize(("old", "new", "value", "setting"), RENAMED)
def test_both_names_with_one_value_are_fine(monkeypatch, old, new, value, setting):
    with pytest.warns(FutureWarning, match=f"^{old} is deprecated"):
        ns = load_settings(monkeypatch, DJANGO_DEBUG="1", **{old: value, new: value})
    assert ns[new] == setting


@pytest.mark.parametrize(("old", "new", "value", "setting"), RENAMED)
def test_both_names_with_two_values_are_refused(monkeypatch, old, new, value, setting):
    with pytest.raises(ImproperlyConfigured) as refused:
        load_settings(monkeypatch, DJANGO_DEBUG="1", **{old: value, new: value + "1"})
    assert str(refused.value) == (
        f"{old} and {new} are set to different values: {old} is the old name of {new}; unset {old}"
    )


def test_an_old_name_is_one_warning_line_on_stderr_of_a_command():
    env = {
        name: value
        for name, value in project_env(SYNC_TRIGGER_TOKEN=TOKEN).items()
        if name != "LOCKS_TRIGGER_TOKEN"
    }
    proc = manage("check", env=env)

    assert proc.returncode == 0, proc.stderr
    [warning] = [line for line in proc.stderr.splitlines() if "Warning:" in line]
    assert warning.endswith(
        "FutureWarning: SYNC_TRIGGER_TOKEN is deprecated: rename it LOCKS_TRIGGER_TOKEN "
        "(the old name stops working in the next release)"
    )
    refused = manage("check", env={**env, "LOCKS_TRIGGER_TOKEN": "another"})
    assert refused.returncode == 1
    assert refused.stderr.strip().splitlines()[-1] == (
        "ImproperlyConfigured: SYNC_TRIGGER_TOKEN and LOCKS_TRIGGER_TOKEN are set to different values: "
        "SYNC_TRIGGER_TOKEN is the old name of LOCKS_TRIGGER_TOKEN; unset SYNC_TRIGGER_TOKEN"
    )


def test_a_bad_switch_value_is_named(monkeypatch):
    with pytest.raises(ImproperlyConfigured, match=r"DJANGO_SECURE_SSL_REDIRECT='sometimes': use 1/0"):
        load_settings(
            monkeypatch, DJANGO_DEBUG="0", DJANGO_SECRET_KEY="x" * 60, DJANGO_SECURE_SSL_REDIRECT="sometimes"
        )


def test_every_kind_of_value_is_read_from_the_environment(monkeypatch):
    monkeypatch.setenv("CODEFORCES_BACKOFF", "1e-2")
    monkeypatch.setenv("CODEFORCES_READ_TIMEOUT", "12.5")
    monkeypatch.setenv("SYNC_CONTESTS_LOCK_TTL", "")  # empty: the default
    ns = load_settings(
        monkeypatch,
        LOCKS_DEFAULT_TTL=" 90 ",
        LOCKS_LOG_LEVEL="debug",
        DJANGO_DEBUG="yes",
        DJANGO_ALLOWED_HOSTS="a.example.com,,b.example.com ",
        DJANGO_SECRET_KEY="$x",
    )
    assert ns["LOCKS_DEFAULT_TTL"] == 90
    assert ns["CODEFORCES_BACKOFF"] == 0.01
    assert ns["CODEFORCES_TIMEOUT"] == (5.0, 12.5)
    assert ns["LOGGING"]["loggers"]["locks"]["level"] == "DEBUG"
    assert ns["LOCKS_JOBS"]["sync_contests"]["ttl"] == 600
    assert ns["ALLOWED_HOSTS"] == ["a.example.com", "b.example.com"]
    assert ns["SECRET_KEY"] == "$x"  # taken as it is, not as the name of another variable


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("LOCKS_DEFAULT_TTL", "abc", "LOCKS_DEFAULT_TTL='abc': expected an integer"),
        ("LOCKS_TRIGGER_RATE_WINDOW", "1.5", "LOCKS_TRIGGER_RATE_WINDOW='1.5': expected an integer"),
        ("CODEFORCES_BACKOFF", "fast", "CODEFORCES_BACKOFF='fast': expected a number"),
        ("DJANGO_DEBUG", "2", "DJANGO_DEBUG='2': use 1/0, true/false, yes/no or on/off"),
        ("CONTESTS_LOG_LEVEL", "loud", "CONTESTS_LOG_LEVEL='loud': expected one of DEBUG, INFO,"),
    ],
)
def test_a_bad_value_is_named_with_what_was_expected(monkeypatch, name, value, message):
    with pytest.raises(ImproperlyConfigured) as excinfo:
        load_settings(monkeypatch, **{"DJANGO_DEBUG": "1", name: value})
    assert str(excinfo.value).startswith(message)


@pytest.mark.parametrize(
    ("name", "value", "message"),
    [
        ("LOCKS_DEFAULT_TTL", "abc", "ImproperlyConfigured: LOCKS_DEFAULT_TTL='abc': expected an integer"),
        (
            "DJANGO_SECURE_COOKIES",
            "sometimes",
            "ImproperlyConfigured: DJANGO_SECURE_COOKIES='sometimes': use 1/0, true/false, yes/no or on/off",
        ),
    ],
)
def test_manage_py_refuses_a_bad_value_in_one_line(name, value, message):
    result = manage("check", env=production_env(**{name: value}))

    assert result.returncode == 1
    assert result.stderr.splitlines() == [message], result.stderr
    assert "Traceback (most recent call last)" not in result.stderr
    assert result.stdout == ""


def test_a_copy_that_skips_never_imports_the_http_client():
    """A skipped tick is most runs of most copies: it loads no HTTP client (issue 11's start-up target)."""
    script = (
        "import django, os, sys; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'config.settings'); "
        "django.setup(); import contests.jobs, contests.management.commands.sync_contests; "
        "print('requests' in sys.modules, 'urllib3' in sys.modules)"
    )
    env = {name: value for name, value in project_env().items() if name != "DATABASE_URL"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "False False\n"


def test_an_sql_database_never_imports_the_mongodb_backend():
    """pymongo and django-mongodb-backend cost start-up time: only a MongoDB URL loads them."""
    script = (
        "import django, os; os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'config.settings'); "
        "django.setup(); import sys; "
        "print('pymongo' in sys.modules, 'django_mongodb_backend' in sys.modules)"
    )
    env = {name: value for name, value in project_env().items() if name != "DATABASE_URL"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "False False\n"

    mongodb = {**env, "DATABASE_URL": "mongodb://127.0.0.1:27017/contests"}
    done = subprocess.run(
        [sys.executable, "-c", script], cwd=ROOT, env=mongodb, capture_output=True, text=True, timeout=60
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout == "True True\n"


# --- system checks ---------------------------------------------------------------


def test_check_deploy_is_clean_under_production_settings():
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=production_env())
    assert result.returncode == 0, result.stdout + result.stderr
    assert "System check identified no issues (0 silenced)." in result.stdout


def test_check_deploy_names_each_protection_that_is_switched_off():
    env = production_env(
        DJANGO_SECURE_SSL_REDIRECT="0",
        DJANGO_SECURE_HSTS_SECONDS="0",
        DJANGO_SECURE_COOKIES="0",
        LOCKS_TRIGGER_TOKEN="short",
    )
    result = manage("check", "--deploy", "--fail-level", "WARNING", env=env)
    assert result.returncode == 1
    found = {code for code in ("W004", "W008", "W012", "W016", "locks.W001") if code in result.stderr}
    assert found == {"W004", "W008", "W012", "W016", "locks.W001"}, result.stderr


def test_the_trigger_settings_are_checked(settings):
    settings.LOCKS_TRIGGER_RATE_WINDOW = 0
    settings.LOCKS_TRUSTED_PROXY_COUNT = -1
    settings.LOCKS_TRIGGER_TOKEN = "too-short"
    ids = {message.id for message in run_checks(include_deployment_checks=True)}
    assert {"locks.E006", "locks.E007", "locks.W001"} <= ids
    settings.LOCKS_TRIGGER_RATE_WINDOW = 10
    settings.LOCKS_TRUSTED_PROXY_COUNT = 1
    settings.LOCKS_TRIGGER_TOKEN = TOKEN
    ids = {message.id for message in run_checks(include_deployment_checks=True)}
    assert not {"locks.E006", "locks.E007", "locks.W001"} & ids


# --- refusing to start -------------------------------------------------------------


def test_refuses_to_start_without_a_secret_key(tmp_path):
    env = production_env()
    del env["DJANGO_SECRET_KEY"]
    result = manage("check", env=env)
    assert result.returncode == 1
    assert "DJANGO_SECRET_KEY is not set" in result.stderr

    log = tmp_path / "gunicorn.log"
    with gunicorn(env=env, log=log) as base, pytest.raises(requests.ConnectionError):
        requests.get(base + "/healthz", timeout=60)  # the worker never boots; gunicorn exits
    assert "DJANGO_SECRET_KEY is not set" in log.read_text()


# --- the documented server, end to end ---------------------------------------------


@pytest.mark.slow
def test_gunicorn_serves_admin_static_files_and_the_endpoints_in_production(db_url, standin, tmp_path):
    static = tmp_path / "static"
    env = production_env(
        DATABASE_URL=db_url,
        DJANGO_ALLOWED_HOSTS="127.0.0.1",
        DJANGO_SECURE_PROXY_SSL_HEADER="1",
        DJANGO_STATIC_ROOT=str(static),
        CODEFORCES_API_URL=standin.url,
        CODEFORCES_MAX_ATTEMPTS="1",
        EMAIL_URL="memorymail://",
        # Only Django decides what is HTTPS here: gunicorn trusts no proxy header.
        FORWARDED_ALLOW_IPS="",
    )
    collected = manage("collectstatic", "--noinput", "-v", "0", env=env, timeout=120)
    assert collected.returncode == 0, collected.stderr
    assert (static / "admin" / "css" / "base.css").is_file()

    https = {"X-Forwarded-Proto": "https"}
    log = tmp_path / "gunicorn.log"
    with gunicorn(env=env, log=log, workers=2) as base:
        never = requests.get(base + "/healthz", timeout=60, allow_redirects=False)
        plain = requests.get(base + "/static/admin/css/base.css", timeout=30, allow_redirects=False)
        css = requests.get(base + "/static/admin/css/base.css", headers=https, timeout=30)
        login = requests.get(base + "/admin/login/", headers=https, timeout=30)
        run = requests.post(
            base + "/api/jobs/sync_contests/run",
            headers={**https, "Authorization": f"Bearer {TOKEN}"},
            timeout=120,
        )
        half = requests.get(base + "/healthz", timeout=30, allow_redirects=False)
        reminders = requests.post(
            base + "/api/jobs/send_reminders/run",
            headers={**https, "Authorization": f"Bearer {TOKEN}"},
            timeout=120,
        )
        watcher = requests.post(  # the locks app's own check_jobs is a registered job too
            base + "/api/jobs/check_jobs/run",
            headers={**https, "Authorization": f"Bearer {TOKEN}"},
            timeout=120,
        )
        healthy = requests.get(base + "/healthz", timeout=30, allow_redirects=False)
    output = log.read_text()

    # /healthz answers plain HTTP (probes), everything else is redirected to HTTPS.
    assert never.status_code == 503, output
    assert plain.status_code == 301
    assert plain.headers["Location"] == base.replace("http://", "https://") + "/static/admin/css/base.css"
    # Static files for the admin come from whitenoise, with HSTS on HTTPS answers.
    assert css.status_code == 200, output
    assert css.headers["Content-Type"].startswith("text/css")
    assert css.headers["Strict-Transport-Security"] == "max-age=31536000; includeSubDomains; preload"
    assert login.status_code == 200
    assert "/static/admin/css/base.css" in login.text
    assert "Secure" in login.headers["Set-Cookie"]
    # The trigger runs the real sync; afterwards the health check is green.
    assert run.status_code == 200, run.text
    assert run.json()["counts"]["created"] == 1758
    assert standin.calls == 1
    assert Contest.objects.count() == 1758
    # Health is per job: fresh once every registered job has succeeded.
    assert half.status_code == 503, half.text
    assert half.json()["jobs"]["sync_contests"]["status"] == "ok"
    assert half.json()["jobs"]["send_reminders"]["status"] == "stale"
    assert reminders.status_code == 200, reminders.text
    assert half.json()["jobs"]["check_jobs"]["status"] == "stale"
    assert watcher.status_code == 200, watcher.text
    assert healthy.status_code == 200, healthy.text
    assert healthy.json()["status"] == "ok"
    assert "Traceback" not in output


# Variables the settings read that no job needs: the web process's tokens and switches, the
# admin login's limits, where collectstatic puts files, and which file crontab_env writes.
WEB_ONLY = {
    *("DJANGO_ALLOWED_HOSTS", "DJANGO_CSRF_TRUSTED_ORIGINS", "DJANGO_STATIC_ROOT", "DJANGO_CRONTAB_ENV_FILE"),
    *("DJANGO_SECURE_SSL_REDIRECT", "DJANGO_SECURE_PROXY_SSL_HEADER", "DJANGO_SECURE_HSTS_SECONDS"),
    *("DJANGO_SECURE_HSTS_INCLUDE_SUBDOMAINS", "DJANGO_SECURE_HSTS_PRELOAD", "DJANGO_SECURE_COOKIES"),
    *("AXES_FAILURE_LIMIT", "AXES_COOLOFF_TIME", "LOCKS_SCHEDULER_GRACE", "LOCKS_SCHEDULER_WORKERS"),
    *("LOCKS_TRIGGER_TOKEN", "LOCKS_TRIGGER_RATE_WINDOW", "LOCKS_HEALTHZ_TOKEN", "LOCKS_TRUSTED_PROXY_COUNT"),
    "LOCKS_METRICS_TOKEN",
    *("SYNC_TRIGGER_TOKEN", "SYNC_TRIGGER_RATE_WINDOW", "HEALTHZ_TOKEN", "DJANGO_TRUSTED_PROXY_COUNT"),
}


def variables_the_settings_read() -> set[str]:
    """Every environment variable config/settings.py and config/lock_settings.py read."""
    import re

    from config.lock_settings import CASTS, OLD_NAMES

    text = (ROOT / "config" / "settings.py").read_text()
    return (
        set(re.findall(r"""env(?:\.\w+)?\(\s*"([A-Z][A-Z0-9_]*)\"""", text))
        | set(CASTS)
        | set(OLD_NAMES.values())
    )


def test_the_crontab_env_file_gets_every_variable_a_job_reads_and_no_other():
    """Issue 21, item 8: an explicit list. A new variable the settings read must be named a
    job's (LOCKS_CRONTAB_ENV_VARIABLES) or the web's (WEB_ONLY above); none is both."""
    from config import settings as project

    read = variables_the_settings_read()
    jobs = set(project.LOCKS_CRONTAB_ENV_VARIABLES)

    assert jobs - read == set()  # no stale name in the list
    assert read - jobs - WEB_ONLY == set()  # nothing read is left unsorted
    assert jobs & WEB_ONLY == set()
    assert {"DATABASE_URL", "DJANGO_SECRET_KEY", "EMAIL_URL", "SYNC_CONTESTS_SCHEDULE"} <= jobs
    assert "DJANGO_SUPERUSER_PASSWORD" not in jobs
