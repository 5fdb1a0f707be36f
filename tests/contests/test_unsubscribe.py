"""One-click unsubscribe (issue 28, item 4; docs/reminders.md, "Unsubscribe"): the headers
and links every reminder carries, through a real SMTP server on loopback
(tests/smtp_standin.py), and the page they open: a POST without login or CSRF token stops
the reminders, a GET changes nothing, a link this site did not sign is a 400 that changes
nothing; the check that refuses a production site without an https:// SITE_URL."""

from __future__ import annotations

import base64
import json
import re
from datetime import timedelta
from email.message import Message

import pytest
from django.core import signing
from django.core.checks import run_checks
from django.test import Client
from django.utils import timezone

from contests.checks import SITE_URL_HINT
from contests.models import Reminder
from contests.reminders import deliver_due_reminders
from contests.unsubscribe import EVERY_CONTEST, StopRequest, make_token, read_token
from tests.contests.reminder_data import make_contest, make_reminder, make_user
from tests.smtp_standin import smtp_standin

pytestmark = pytest.mark.django_db
SITE = "https://contests.example.com"
ONE_CLICK = "List-Unsubscribe=One-Click"


@pytest.fixture(autouse=True)
def site(settings):
    settings.SITE_URL = SITE
    settings.SEND_REMINDERS_UNSUBSCRIBE_MAILTO = ""


@pytest.fixture
def client():
    """A browser, or a mailbox provider: no session, and CSRF checks on as in production."""
    return Client(enforce_csrf_checks=True)


@pytest.fixture
def soon():
    return make_contest(1843, start=timedelta(hours=2), name="Codeforces Round 999 (Div. 2)")


@pytest.fixture
def later():
    return make_contest(1844, start=timedelta(days=2), name="Codeforces Round 1000 (Div. 1)")


@pytest.fixture
def alice():
    return make_user("alice")


def one_line(header: str) -> str:
    return " ".join(str(header).split())  # a folded header's line breaks are not part of it


def sent(settings, *, mailto: str = "") -> list[Message]:
    """Deliver what is due through the SMTP stand-in; the messages it received."""
    settings.SEND_REMINDERS_UNSUBSCRIBE_MAILTO = mailto
    with smtp_standin() as server:
        settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", server.port
        deliver_due_reminders()
    return server.messages


def path_of(url: str) -> str:
    assert url.startswith(f"{SITE}/reminders/unsubscribe/"), url
    return url.removeprefix(SITE)


def post(client, url: str):
    """What a mailbox provider sends for a one-click unsubscribe (RFC 8058, 3.2)."""
    return client.post(path_of(url), data=ONE_CLICK, content_type="application/x-www-form-urlencoded")


def text(response) -> str:
    body = response.content.decode()
    return " ".join(re.sub(r"<[^>]+>", " ", body.split("<body>")[1]).split())


# --- the headers and links ----------------------------------------------------------------


def test_every_reminder_carries_list_unsubscribe_with_an_https_link_and_one_click_post(settings, soon, alice):
    reminder = make_reminder(alice, soon, at=-timedelta(minutes=1))
    bob = make_reminder(make_user("bob"), soon, at=-timedelta(minutes=1))

    messages = sent(settings)

    assert len(messages) == 2
    for message in messages:
        owner = reminder if message["To"] == "alice@example.com" else bob
        [url] = re.fullmatch(r"<([^>]+)>", one_line(message["List-Unsubscribe"])).groups()
        assert url.startswith("https://contests.example.com/reminders/unsubscribe/")
        token = url.removeprefix(f"{SITE}/reminders/unsubscribe/").removesuffix("/")
        assert read_token(token) == StopRequest(user=str(owner.user_id), contest=None)
        assert message["List-Unsubscribe-Post"] == ONE_CLICK
        assert message["Auto-Submitted"] == "auto-generated"
        body = message.get_payload().replace("\r\n", "\n")
        # The body's two links open the page with its button: this contest, or every reminder.
        for_contest = make_token(user_pk=owner.user_id, contest_pk=soon.pk)
        assert f"No more reminders for this contest: {SITE}/reminders/unsubscribe/{for_contest}/\n" in body
        assert f"No more reminders at all: {url}\n" in body


def test_a_mailto_is_offered_too_when_an_address_takes_unsubscribe_requests(settings, soon, alice):
    make_reminder(alice, soon, at=-timedelta(minutes=1))

    [message] = sent(settings, mailto="unsubscribe@contests.example.com")

    token = make_token(user_pk=alice.pk, contest_pk=EVERY_CONTEST)
    assert one_line(message["List-Unsubscribe"]) == (
        f"<{SITE}/reminders/unsubscribe/{token}/>, "
        f"<mailto:unsubscribe@contests.example.com?subject=unsubscribe%20{token.replace(':', '%3A')}>"
    )
    assert message["List-Unsubscribe-Post"] == ONE_CLICK


# --- the page -------------------------------------------------------------------------------


def test_a_one_click_post_without_login_or_csrf_token_deletes_the_users_reminders(
    client, settings, soon, later, alice
):
    make_reminder(alice, soon, at=-timedelta(minutes=1))
    make_reminder(alice, later, at=timedelta(days=1))
    delivered = make_reminder(alice, soon, at=-timedelta(minutes=5), delivered_at=timezone.now())
    bobs = make_reminder(make_user("bob"), soon, at=-timedelta(minutes=1))
    url = f"{SITE}/reminders/unsubscribe/{make_token(user_pk=alice.pk, contest_pk=EVERY_CONTEST)}/"

    response = post(client, url)

    assert response.status_code == 200
    assert text(response) == "Done: you will get no more reminders from this site."
    # What is left: the delivered one (history, it sends nothing) and bob's.
    assert set(Reminder.objects.values_list("pk", flat=True)) == {delivered.pk, bobs.pk}

    again = post(client, url)  # a second click, a provider that retries: harmless

    assert again.status_code == 200
    assert text(again) == "Done: you will get no more reminders from this site."
    assert set(Reminder.objects.values_list("pk", flat=True)) == {delivered.pk, bobs.pk}


def test_the_link_for_one_contest_stops_only_that_contests_reminders(client, soon, later, alice):
    make_reminder(alice, soon, at=-timedelta(minutes=1))
    make_reminder(alice, soon, at=-timedelta(minutes=2))
    kept = make_reminder(alice, later, at=timedelta(days=1))
    url = f"{SITE}/reminders/unsubscribe/{make_token(user_pk=alice.pk, contest_pk=soon.pk)}/"

    response = post(client, url)

    assert response.status_code == 200
    assert text(response) == "Done: you will get no more reminders for Codeforces Round 999 (Div. 2)."
    assert list(Reminder.objects.all()) == [kept]


def test_the_button_of_the_page_a_link_opens_does_the_same(client, soon, alice):
    make_reminder(alice, soon, at=-timedelta(minutes=1))
    path = f"/reminders/unsubscribe/{make_token(user_pk=alice.pk, contest_pk=soon.pk)}/"

    response = client.post(path, {"List-Unsubscribe": "One-Click"})  # the form's own fields

    assert response.status_code == 200
    assert not Reminder.objects.exists()


def test_a_get_shows_a_page_with_a_button_and_changes_nothing(client, soon, alice):
    """Mail scanners and link previews follow every link in an email with a GET."""
    reminder = make_reminder(alice, soon, at=-timedelta(minutes=1))
    path = f"/reminders/unsubscribe/{make_token(user_pk=alice.pk, contest_pk=soon.pk)}/"

    page = client.get(path)
    head = client.head(path)

    assert page.status_code == head.status_code == 200
    body = page.content.decode()
    assert '<form method="post">' in body
    assert '<input type="hidden" name="List-Unsubscribe" value="One-Click">' in body
    assert '<button type="submit">Stop reminders</button>' in body
    assert text(page) == "Stop the reminders for Codeforces Round 999 (Div. 2)? Stop reminders"
    assert page["Cache-Control"].startswith("max-age=0")
    assert list(Reminder.objects.all()) == [reminder]
    assert reminder.claimed_by == Reminder.objects.get().claimed_by == ""


def tampered(token: str) -> list[str]:
    """``token`` changed in the ways an attacker or a broken mail client would."""
    value, signature = token.rsplit(":", 1)
    payload = json.loads(base64.urlsafe_b64decode(value + "=" * (-len(value) % 4)))
    other_user = base64.urlsafe_b64encode(json.dumps({**payload, "u": "999"}).encode()).decode().rstrip("=")
    return [
        f"{value}:{signature[:-1]}{'A' if signature[-1] != 'A' else 'B'}",  # one character of the signature
        f"{other_user}:{signature}",  # another user's id under this one's signature
        token[:-10],  # cut short
        signing.Signer(salt="another.salt").sign_object(payload),  # signed by this site for another use
        signing.dumps(payload),  # Django's default salt, with a timestamp
        "nothing-signed-here",
    ]


@pytest.mark.parametrize("method", ["get", "post"])
def test_a_bad_or_tampered_token_answers_400_and_changes_nothing(client, soon, alice, method):
    make_reminder(alice, soon, at=-timedelta(minutes=1))
    make_reminder(make_user("999"), soon, at=-timedelta(minutes=1))
    token = make_token(user_pk=alice.pk, contest_pk=EVERY_CONTEST)

    for bad in tampered(token):
        response = getattr(client, method)(f"/reminders/unsubscribe/{bad}/")

        assert response.status_code == 400, bad
        assert text(response) == (
            "This unsubscribe link is not valid (it may have been cut short): nothing was changed. "
            "Use the link exactly as it came in a reminder."
        )
        assert Reminder.objects.count() == 2
    assert read_token(token) == StopRequest(user=str(alice.pk))  # the untouched one still reads


def test_only_get_head_and_post_are_answered(client, soon, alice):
    make_reminder(alice, soon, at=-timedelta(minutes=1))
    path = f"/reminders/unsubscribe/{make_token(user_pk=alice.pk, contest_pk=EVERY_CONTEST)}/"

    assert client.put(path).status_code == 405
    assert client.delete(path).status_code == 405
    assert Reminder.objects.count() == 1


def test_the_link_a_real_email_carries_stops_that_users_reminders(client, settings, soon, later, alice):
    """End to end: the URL from the header of a message the SMTP server received."""
    first = make_reminder(alice, soon, at=-timedelta(minutes=1))
    make_reminder(alice, later, at=timedelta(days=1))
    bobs = make_reminder(make_user("bob"), later, at=timedelta(days=1))

    [message] = sent(settings)
    [url] = re.fullmatch(r"<([^>]+)>", one_line(message["List-Unsubscribe"])).groups()

    assert post(client, url).status_code == 200
    # Left: the one that sent this email (delivered: nothing more comes of it) and bob's.
    left = {r.pk: r.delivered_at is not None for r in Reminder.objects.all()}
    assert left == {first.pk: True, bobs.pk: False}


def test_a_token_names_saved_rows_only():
    with pytest.raises(ValueError, match="a token names a saved user"):
        make_token(user_pk=1, contest_pk=None)  # an unsaved contest is never "every contest"


# --- the check ------------------------------------------------------------------------------


def _site_errors():
    return [m for m in run_checks() if m.id == "contests.E010"]


@pytest.mark.parametrize(
    ("debug", "url", "message"),
    [
        (False, "", "must be this site's https:// address when DEBUG is off, and it is not set"),
        (False, "http://contests.example.com", "when DEBUG is off, got 'http://contests.example.com'"),
        (False, "https://contests.example.com", None),
        (True, "http://localhost:8000", None),  # DJANGO_DEBUG=1's default
        (True, "", None),
        (True, "contests.example.com", "must be an http:// or https:// address with a host"),
        (False, "https://", "must be an http:// or https:// address with a host"),
        (False, "https://[::1", "must be an http:// or https:// address with a host"),
    ],
)
def test_sending_reminders_in_production_needs_an_https_site_url(settings, debug, url, message):
    settings.DEBUG, settings.SITE_URL = debug, url

    found = _site_errors()

    if message is None:
        assert found == []
    else:
        [error] = found
        assert message in error.msg
        assert error.hint == SITE_URL_HINT


def test_without_the_reminders_job_no_site_url_is_needed(settings):
    settings.DEBUG, settings.SITE_URL = False, ""
    assert len(_site_errors()) == 1
    settings.LOCKS_JOBS = {"sync_contests": settings.LOCKS_JOBS["sync_contests"]}
    assert _site_errors() == []


def test_a_bad_unsubscribe_address_fails_its_check(settings):
    settings.SEND_REMINDERS_UNSUBSCRIBE_MAILTO = "unsubscribe at example.com"
    [error] = [m for m in run_checks() if m.id == "contests.E011"]
    assert "must be an email address, got 'unsubscribe at example.com'" in error.msg
    settings.SEND_REMINDERS_UNSUBSCRIBE_MAILTO = "unsubscribe@example.com"
    assert not [m for m in run_checks() if m.id == "contests.E011"]
