"""The admin login: Django's password validators, and django-axes locking out a
username and client address after five failures, through the real login form."""

from __future__ import annotations

import runpy
from datetime import timedelta
from io import StringIO

import pytest
from axes.models import AccessAttempt
from django.contrib.auth.password_validation import validate_password
from django.core.exceptions import ValidationError
from django.core.management import call_command
from django.test import Client

from locks.models import now_plus
from tests.conftest import ROOT

LOGIN = "/admin/login/?next=/admin/"
PASSWORD = "correct horse battery staple"
LOCKED = "Account locked: too many login attempts. Please try again later."


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def admin(django_user_model):
    return django_user_model.objects.create_superuser("root", "root@example.com", PASSWORD)


def log_in(client: Client, password: str, *, addr: str = "192.0.2.10", username: str = "root", **headers):
    return client.post(
        LOGIN, {"username": username, "password": password, "next": "/admin/"}, REMOTE_ADDR=addr, **headers
    )


def logged_in(client: Client) -> bool:
    return client.get("/admin/").status_code == 200


def test_the_right_password_logs_in(client, admin):
    response = log_in(client, PASSWORD)
    assert response.status_code == 302
    assert response["Location"] == "/admin/"
    assert logged_in(client)


def test_five_failures_lock_out_the_right_password_until_axes_reset(client, admin):
    for attempt in range(1, 5):
        response = log_in(client, f"wrong-{attempt}")
        assert response.status_code == 200, attempt  # the form again, with its error
        assert "Please enter the correct username and password" in response.content.decode()
    fifth = log_in(client, "wrong-5")
    assert fifth.status_code == 429
    assert AccessAttempt.objects.get().failures_since_start == 5

    sixth = log_in(client, PASSWORD)

    assert sixth.status_code == 429
    assert sixth.content.decode() == LOCKED
    assert not logged_in(client)

    out = StringIO()
    call_command("axes_reset", stdout=out)
    assert "1 attempts removed." in out.getvalue()
    assert log_in(client, PASSWORD).status_code == 302
    assert logged_in(client)


def test_the_lockout_is_per_username_and_address(client, admin, django_user_model):
    django_user_model.objects.create_superuser("other", "other@example.com", PASSWORD)
    for attempt in range(5):
        log_in(client, f"wrong-{attempt}", addr="192.0.2.10")
    assert log_in(client, PASSWORD, addr="192.0.2.10").status_code == 429

    assert log_in(Client(), PASSWORD, addr="192.0.2.11").status_code == 302  # same user, other address
    assert log_in(Client(), PASSWORD, addr="192.0.2.10", username="other").status_code == 302


def test_four_failures_do_not_lock_out(client, admin):
    for attempt in range(4):
        log_in(client, f"wrong-{attempt}")
    assert log_in(client, PASSWORD).status_code == 302


def test_the_lockout_ends_after_the_cool_off_hour(client, admin):
    for attempt in range(5):
        log_in(client, f"wrong-{attempt}")
    assert log_in(client, PASSWORD).status_code == 429

    # The failures (and the refusal, which restarted the wait) just under an hour ago: still locked.
    AccessAttempt.objects.update(attempt_time=now_plus(-timedelta(minutes=59)))
    assert log_in(client, PASSWORD).status_code == 429
    AccessAttempt.objects.update(attempt_time=now_plus(-timedelta(minutes=61)))
    assert log_in(client, PASSWORD).status_code == 302


def test_behind_a_trusted_proxy_the_lockout_keys_on_the_forwarded_client(client, admin, settings):
    settings.LOCKS_TRUSTED_PROXY_COUNT = 1
    proxy = "10.0.0.9"
    for attempt in range(5):
        log_in(client, f"wrong-{attempt}", addr=proxy, HTTP_X_FORWARDED_FOR=f"6.6.6.{attempt}, 203.0.113.5")
    assert AccessAttempt.objects.get().ip_address == "203.0.113.5"

    refused = log_in(Client(), PASSWORD, addr=proxy, HTTP_X_FORWARDED_FOR="203.0.113.5")
    other = log_in(Client(), PASSWORD, addr=proxy, HTTP_X_FORWARDED_FOR="203.0.113.6")

    assert refused.status_code == 429
    assert other.status_code == 302


def test_the_failure_limit_follows_the_setting(client, admin, settings):
    settings.AXES_FAILURE_LIMIT = 2
    log_in(client, "wrong-1")
    assert log_in(client, "wrong-2").status_code == 429
    assert log_in(client, PASSWORD).status_code == 429


def test_limit_and_cool_off_come_from_the_environment(monkeypatch):
    monkeypatch.setenv("AXES_FAILURE_LIMIT", "3")
    monkeypatch.setenv("AXES_COOLOFF_TIME", "0.5")
    ns = runpy.run_path(str(ROOT / "config" / "settings.py"))
    assert (ns["AXES_FAILURE_LIMIT"], ns["AXES_COOLOFF_TIME"]) == (3, timedelta(minutes=30))
    monkeypatch.delenv("AXES_FAILURE_LIMIT")
    monkeypatch.delenv("AXES_COOLOFF_TIME")
    ns = runpy.run_path(str(ROOT / "config" / "settings.py"))
    assert (ns["AXES_FAILURE_LIMIT"], ns["AXES_COOLOFF_TIME"]) == (5, timedelta(hours=1))
    assert ns["AXES_LOCKOUT_PARAMETERS"] == [["username", "ip_address"]]
    assert ns["AUTHENTICATION_BACKENDS"][0] == "axes.backends.AxesStandaloneBackend"


@pytest.mark.parametrize("password", ["1", "password", "12345678901234", "root@example.com"])
def test_weak_passwords_are_refused(admin, password):
    with pytest.raises(ValidationError):
        validate_password(password, user=admin)


def test_a_strong_password_is_accepted(admin):
    assert validate_password(PASSWORD, user=admin) is None


def test_the_four_standard_validators_are_on(settings):
    names = [validator["NAME"].rsplit(".", 1)[1] for validator in settings.AUTH_PASSWORD_VALIDATORS]
    assert names == [
        "UserAttributeSimilarityValidator",
        "MinimumLengthValidator",
        "CommonPasswordValidator",
        "NumericPasswordValidator",
    ]
