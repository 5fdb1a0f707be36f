"""Reminder delivery in-process: what is due, the claim, the email, failures, checks."""

from __future__ import annotations

import re
from datetime import UTC, timedelta

import pytest
from django.core.checks import run_checks
from django.core.mail import get_connection
from django.db.models.functions import Now
from django.utils import timezone

from contests.models import Reminder
from contests.reminders import ReminderDeliveryError, claim_reminder, deliver_due_reminders, retry_reminders
from locks.claims import Lease, LockLost
from tests.conftest import manage, project_env
from tests.contests.reminder_data import due_reminders, make_contest, make_reminder, make_user
from tests.smtp_standin import smtp_standin
from tests.test_mongodb_settings import closed_port

pytestmark = pytest.mark.django_db
SMTP = "django.core.mail.backends.smtp.EmailBackend"


@pytest.fixture
def soon():
    return make_contest(1843, start=timedelta(hours=2), name="Codeforces Round 999 (Div. 2)")


@pytest.fixture
def alice():
    return make_user("alice")


def smtp(port: int):
    return get_connection(SMTP, host="127.0.0.1", port=port, timeout=5, fail_silently=False)


def test_due_means_time_come_contest_not_started_nor_removed_and_not_done(soon, alice):
    started = make_contest(2, start=-timedelta(minutes=5))
    removed = make_contest(3, start=timedelta(days=1), removed_at=timezone.now())
    no_start = make_contest(4, start=None, phase="BEFORE")
    due = make_reminder(alice, soon, at=-timedelta(minutes=1))
    make_reminder(alice, soon, at=timedelta(minutes=10))  # not yet
    make_reminder(alice, started, at=-timedelta(hours=1))
    make_reminder(alice, removed, at=-timedelta(minutes=1))
    make_reminder(alice, no_start, at=-timedelta(minutes=1))
    make_reminder(alice, soon, at=-timedelta(minutes=2), delivered_at=timezone.now())
    make_reminder(alice, soon, at=-timedelta(minutes=3), failed_at=timezone.now())

    assert list(Reminder.objects.due()) == [due]
    # With an explicit now: an hour later the first contest has still not started.
    later = timezone.now() + timedelta(hours=1)
    assert {r.remind_at > timezone.now() for r in Reminder.objects.due(now=later)} == {False, True}
    assert list(Reminder.objects.due(now=timezone.now() + timedelta(hours=3))) == []


def test_a_due_reminder_is_emailed_once_with_the_name_the_start_in_utc_and_the_link(soon, alice, mailoutbox):
    reminder = make_reminder(alice, soon, at=-timedelta(minutes=1))

    stats = deliver_due_reminders()

    assert stats.as_dict() == {"due": 1, "sent": 1, "failed": 0, "skipped": 0}
    [message] = mailoutbox
    start = soon.start_time.astimezone(UTC)
    assert message.to == ["alice@example.com"]
    assert message.subject == f"Reminder: Codeforces Round 999 (Div. 2) starts {start:%Y-%m-%d %H:%M} UTC"
    assert f"starts on {start:%A %d %B %Y, %H:%M} UTC, in 1 hour, 59 minutes." in message.body
    assert "Contest page: https://codeforces.com/contest/1843\n" in message.body
    reminder.refresh_from_db()
    assert reminder.delivered_at is not None
    assert (reminder.attempts, reminder.claimed_until, reminder.claimed_by, reminder.last_error) == (
        1,
        None,
        "",
        "",
    )

    again = deliver_due_reminders()

    assert again.as_dict() == {"due": 0, "sent": 0, "failed": 0, "skipped": 0}
    assert len(mailoutbox) == 1


def test_not_yet_due_and_stale_reminders_send_nothing(soon, alice, mailoutbox):
    make_reminder(alice, soon, at=timedelta(minutes=30))
    make_reminder(alice, make_contest(2, start=-timedelta(minutes=1)), at=-timedelta(hours=1))
    make_reminder(
        alice, make_contest(3, start=timedelta(days=1), removed_at=timezone.now()), at=-timedelta(hours=1)
    )

    assert deliver_due_reminders().as_dict() == {"due": 0, "sent": 0, "failed": 0, "skipped": 0}
    assert mailoutbox == []
    assert not Reminder.objects.filter(attempts__gt=0).exists()


def test_a_user_without_an_email_address_is_skipped_counted_and_not_due_again(soon, alice, mailoutbox):
    bob = make_user("bob", email="")
    make_reminder(alice, soon, at=-timedelta(minutes=1))
    skipped = make_reminder(bob, soon, at=-timedelta(minutes=1))

    assert deliver_due_reminders().as_dict() == {"due": 2, "sent": 1, "failed": 0, "skipped": 1}
    assert [m.to for m in mailoutbox] == [["alice@example.com"]]
    skipped.refresh_from_db()
    assert skipped.failed_at is not None
    assert skipped.delivered_at is None
    assert skipped.attempts == 0
    assert skipped.last_error == "not sent: user bob has no email address"
    assert deliver_due_reminders().due == 0

    # Once bob has an address, the admin's retry action makes it pending again.
    bob.email = "bob@example.com"
    bob.save()
    assert retry_reminders(reminders=Reminder.objects.all()) == 1
    assert deliver_due_reminders().as_dict() == {"due": 1, "sent": 1, "failed": 0, "skipped": 0}
    assert mailoutbox[-1].to == ["bob@example.com"]


def test_the_claim_is_one_conditional_update_only_one_run_wins(soon, alice):
    reminder = make_reminder(alice, soon, at=-timedelta(minutes=1))

    assert claim_reminder(reminder=reminder, holder="host:1:aaaaaa", max_attempts=5) is True
    assert claim_reminder(reminder=reminder, holder="host:2:bbbbbb", max_attempts=5) is False
    reminder.refresh_from_db()
    assert (reminder.claimed_by, reminder.attempts) == ("host:1:aaaaaa", 1)
    assert reminder.claimed_until > timezone.now() + timedelta(minutes=9)


def test_a_reminder_claimed_by_another_run_waits_until_its_claim_expires(soon, alice, mailoutbox):
    reminder = make_reminder(alice, soon, at=-timedelta(minutes=1))
    claim_reminder(reminder=reminder, holder="host:1:aaaaaa", max_attempts=5)

    assert deliver_due_reminders().as_dict() == {"due": 0, "sent": 0, "failed": 0, "skipped": 0}
    assert mailoutbox == []

    # The claimer died; its claim runs out (written into the past, database clock).
    Reminder.objects.filter(pk=reminder.pk).update(claimed_until=Now() - timedelta(seconds=1))

    assert deliver_due_reminders().as_dict() == {"due": 1, "sent": 1, "failed": 0, "skipped": 0}
    reminder.refresh_from_db()
    assert (reminder.attempts, reminder.delivered_at is not None) == (2, True)


def test_a_refused_message_records_its_error_and_is_retried_up_to_the_attempt_limit(soon, settings):
    settings.SEND_REMINDERS_MAX_ATTEMPTS = 3
    refused = make_reminder(make_user("ghost"), soon, at=-timedelta(minutes=2))
    accepted = make_reminder(make_user("alice"), soon, at=-timedelta(minutes=1))
    with smtp_standin() as server:
        server.refused.add("ghost@example.com")

        first = deliver_due_reminders(connection=smtp(server.port))

        assert first.as_dict() == {"due": 2, "sent": 1, "failed": 1, "skipped": 0}
        assert [m["To"] for m in server.messages] == ["alice@example.com"]  # the batch went on
        refused.refresh_from_db()
        assert refused.attempts == 1
        assert (refused.claimed_until, refused.claimed_by, refused.failed_at) == (None, "", None)
        assert refused.last_error.startswith("attempt 1: SMTPRecipientsRefused: ")
        assert "550" in refused.last_error and "no such user" in refused.last_error
        assert list(Reminder.objects.due()) == [refused]  # a later run retries it

        assert deliver_due_reminders(connection=smtp(server.port)).as_dict()["failed"] == 1
        assert deliver_due_reminders(connection=smtp(server.port)).as_dict()["failed"] == 1
        refused.refresh_from_db()
        assert refused.attempts == 3
        assert refused.failed_at is not None
        assert refused.last_error.startswith("attempt 3: SMTPRecipientsRefused")
        assert deliver_due_reminders(connection=smtp(server.port)).due == 0
        assert len(server.messages) == 1
    accepted.refresh_from_db()
    assert accepted.delivered_at is not None


def test_an_unreachable_mail_server_stops_the_run_and_uses_no_attempt(soon, alice):
    reminder = make_reminder(alice, soon, at=-timedelta(minutes=1))

    with pytest.raises(ReminderDeliveryError) as excinfo:
        deliver_due_reminders(connection=smtp(closed_port()))

    assert str(excinfo.value).startswith(
        "not sent yet: the mail server is unreachable: ConnectionRefusedError"
    )
    assert str(excinfo.value).endswith("1 due reminders wait for the next run, no attempt used")
    reminder.refresh_from_db()
    assert (reminder.attempts, reminder.claimed_until, reminder.delivered_at) == (0, None, None)
    assert reminder.last_error.startswith("not sent yet: the mail server is unreachable")
    assert list(Reminder.objects.due()) == [reminder]


def test_a_run_that_died_on_the_last_attempt_gives_the_reminder_up(soon, alice, mailoutbox, settings):
    settings.SEND_REMINDERS_MAX_ATTEMPTS = 2
    reminder = make_reminder(alice, soon, at=-timedelta(minutes=1), attempts=2)
    Reminder.objects.filter(pk=reminder.pk).update(
        claimed_until=Now() - timedelta(seconds=1), claimed_by="dead:1:cccccc"
    )

    assert deliver_due_reminders().as_dict() == {"due": 1, "sent": 0, "failed": 1, "skipped": 0}
    assert mailoutbox == []
    reminder.refresh_from_db()
    assert reminder.failed_at is not None
    assert reminder.last_error == (
        "gave up after 2 attempts; the last one never recorded its outcome, so its email may have gone out"
    )


def test_a_lost_lease_stops_the_run_before_the_next_claim(soon, alice, mailoutbox):
    reminder = make_reminder(alice, soon, at=-timedelta(minutes=1))
    lease = Lease(
        job="send_reminders",
        holder="host:1:aaaaaa",
        token=1,
        tick=None,
        ttl=timedelta(seconds=60),
        acquired_at=timezone.now(),
    )
    lease.mark_lost("taken over by host:2:bbbbbb")

    with pytest.raises(LockLost, match="taken over by host:2:bbbbbb"):
        deliver_due_reminders(lease=lease)

    assert mailoutbox == []
    reminder.refresh_from_db()
    assert reminder.attempts == 0


def test_the_dry_run_counts_and_changes_nothing(soon, alice, mailoutbox):
    due_reminders(3, contest=soon)
    make_reminder(make_user("bob", email=""), soon, at=-timedelta(minutes=1))

    assert deliver_due_reminders(dry_run=True).as_dict() == {"due": 4, "sent": 0, "failed": 0, "skipped": 1}
    assert mailoutbox == []
    assert not Reminder.objects.filter(attempts__gt=0).exists()
    assert not Reminder.objects.filter(failed_at__isnull=False).exists()


def test_one_smtp_connection_serves_the_whole_batch(soon, settings):
    due_reminders(5, contest=soon)
    with smtp_standin() as server:
        settings.EMAIL_BACKEND = SMTP
        settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", server.port

        assert deliver_due_reminders().sent == 5

    assert len(server.messages) == 5
    assert server.sessions == 1
    assert {m["To"] for m in server.messages} == {f"user{n}@example.com" for n in range(5)}
    assert {m["From"] for m in server.messages} == {"reminders@localhost"}


# --- settings and checks -------------------------------------------------------------


def _ids() -> set[str]:
    return {message.id for message in run_checks()}


def test_the_default_settings_pass_the_reminder_checks():
    assert not {i for i in _ids() if i in {"contests.E005", "contests.E006"}}


@pytest.mark.parametrize(
    ("name", "value", "code", "text"),
    [
        ("SEND_REMINDERS_CLAIM_TTL", 30, "contests.E005", "must be more than three times EMAIL_TIMEOUT"),
        ("SEND_REMINDERS_MAX_ATTEMPTS", 0, "contests.E006", "must be 1 or more, got 0"),
    ],
)
def test_a_bad_reminder_setting_fails_its_check(settings, name, value, code, text):
    setattr(settings, name, value)

    [error] = [m for m in run_checks() if m.id == code]

    assert name in error.msg
    assert text in error.msg


def test_email_url_sets_the_smtp_server_and_a_bad_one_is_named_without_its_password():
    probe = (
        "import django; django.setup(); from django.conf import settings as s; "
        "print(s.EMAIL_BACKEND, s.EMAIL_HOST, s.EMAIL_PORT, s.EMAIL_HOST_USER, s.EMAIL_HOST_PASSWORD, "
        "s.EMAIL_USE_TLS, s.EMAIL_TIMEOUT, s.DEFAULT_FROM_EMAIL)"
    )
    import subprocess
    import sys

    from tests.conftest import ROOT

    def run(**env):
        return subprocess.run(
            [sys.executable, "-c", probe],
            cwd=ROOT,
            env=project_env(DJANGO_SETTINGS_MODULE="config.settings", **env),
            capture_output=True,
            text=True,
            timeout=60,
        )

    good = run(
        EMAIL_URL="smtp+tls://mailer:s%40cret@mail.example.com:587", DEFAULT_FROM_EMAIL="cf@example.com"
    )
    assert good.stdout.split() == [
        SMTP, "mail.example.com", "587", "mailer", "s@cret", "True", "10", "cf@example.com"
    ]  # fmt: skip
    assert run().stdout.split()[0] == "django.core.mail.backends.console.EmailBackend"  # DJANGO_DEBUG=1

    bad = manage("check", env=project_env(EMAIL_URL="smtp://mailer:s3cret@mail.example.com:25x"))
    assert bad.returncode == 1
    assert re.search(r"ImproperlyConfigured: EMAIL_URL: Port could not be cast", bad.stderr), bad.stderr
    assert "s3cret" not in bad.stderr.splitlines()[-1]
