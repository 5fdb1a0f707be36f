"""Reminder delivery in-process: what is due, batched claims, the email, refusals, the
unknown outcome, connections, checks. Against a real SMTP server on loopback
(tests/smtp_standin.py) where the SMTP conversation matters."""

from __future__ import annotations

import re
import subprocess
import sys
import threading
import time
from collections import Counter
from datetime import UTC, timedelta

import pytest
from django.core.checks import run_checks
from django.core.mail.utils import DNS_NAME
from django.db import connection, connections, transaction
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from contests import reminders, senders
from contests.mail import StagedSMTPBackend, message_id, one_line, reminder_backend
from contests.models import Reminder
from contests.reminders import (
    ReminderDeliveryError,
    claim_batch,
    deliver_due_reminders,
    retry_reminders,
)
from locks.lease import Grant, Lease, LockLost
from tests.conftest import ROOT, manage, project_env
from tests.contests.reminder_data import (
    due_reminders,
    make_contest,
    make_reminder,
    make_user,
    many_due_reminders,
)
from tests.smtp_standin import smtp_standin
from tests.test_mongodb_settings import closed_port

pytestmark = pytest.mark.django_db
SMTP = "django.core.mail.backends.smtp.EmailBackend"
NOTHING = {"due": 0, "sent": 0, "failed": 0, "uncertain": 0, "skipped": 0}


def stats(**counts: int) -> dict[str, int]:
    return {**NOTHING, **counts}


@pytest.fixture
def soon():
    return make_contest(1843, start=timedelta(hours=2), name="Codeforces Round 999 (Div. 2)")


@pytest.fixture
def alice():
    return make_user("alice")


@pytest.fixture
def server(settings):
    """The SMTP stand-in, configured as the project's mail server (Django's SMTP backend,
    as EMAIL_URL=smtp://… sets it), with a 2 s EMAIL_TIMEOUT."""
    with smtp_standin() as standin:
        settings.EMAIL_BACKEND = SMTP
        settings.EMAIL_HOST, settings.EMAIL_PORT, settings.EMAIL_TIMEOUT = "127.0.0.1", standin.port, 2
        yield standin


def a_lease(*, holder: str) -> Lease:
    """A lease of the send_reminders job as ``run_locked`` hands it to the job."""
    return Lease(
        job="send_reminders",
        holder=holder,
        token=1,
        tick=None,
        ttl=timedelta(seconds=60),
        grant=Grant(acquired_at=timezone.now()),
    )


def state(reminder: Reminder) -> tuple:
    """(attempts, delivered, uncertain, failed, claimed) of a reminder, from the database."""
    reminder.refresh_from_db()
    return (
        reminder.attempts,
        reminder.delivered_at is not None,
        reminder.uncertain_at is not None,
        reminder.failed_at is not None,
        reminder.claimed_until is not None,
    )


PENDING, DELIVERED, UNCERTAIN = (
    (False, False, False, False),
    (True, False, False, False),
    (False, True, False, False),
)


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
    make_reminder(alice, soon, at=-timedelta(minutes=4), uncertain_at=timezone.now())

    assert list(Reminder.objects.due()) == [due]
    # With an explicit now: an hour later the first contest has still not started.
    later = timezone.now() + timedelta(hours=1)
    assert {r.remind_at > timezone.now() for r in Reminder.objects.due(now=later)} == {False, True}
    assert list(Reminder.objects.due(now=timezone.now() + timedelta(hours=3))) == []


def test_a_due_reminder_is_emailed_once_with_the_name_the_start_in_utc_and_the_link(soon, alice, mailoutbox):
    reminder = make_reminder(alice, soon, at=-timedelta(minutes=1))

    assert deliver_due_reminders().as_dict() == stats(due=1, sent=1)

    [message] = mailoutbox
    start = soon.start_time.astimezone(UTC)
    assert message.to == ["alice@example.com"]
    assert message.subject == f"Reminder: Codeforces Round 999 (Div. 2) starts {start:%Y-%m-%d %H:%M} UTC"
    assert f"starts on {start:%A %d %B %Y, %H:%M} UTC, in 1 hour, 59 minutes." in message.body
    assert "Contest page: https://codeforces.com/contest/1843\n" in message.body
    assert state(reminder) == (1, *DELIVERED)
    assert reminder.last_error == ""
    assert re.fullmatch(r".+:\d+:[0-9a-f]{6}/[0-9a-f]{6}\.1", reminder.claimed_by)  # the run's batch 1

    assert deliver_due_reminders().as_dict() == NOTHING
    assert len(mailoutbox) == 1


def test_a_reminder_has_one_message_id_on_every_send_and_says_it_is_auto_generated(
    soon, alice, settings, mailoutbox
):
    """Issue 28, item 3: <reminder-PK@DOMAIN>, the domain from SEND_REMINDERS_MESSAGE_ID_DOMAIN
    (default: Django's DNS_NAME), the same each time it is sent; Auto-Submitted (RFC 3834)."""
    settings.SEND_REMINDERS_MESSAGE_ID_DOMAIN = "reminders.example.com"
    reminder = make_reminder(alice, soon, at=-timedelta(minutes=1))
    other = make_reminder(make_user("bob"), soon, at=-timedelta(minutes=1))

    assert deliver_due_reminders().sent == 2
    Reminder.objects.update(delivered_at=None)  # as if the record had been lost: sent again
    assert deliver_due_reminders().sent == 2

    built = [message.message() for message in mailoutbox]
    by_pk = {reminder.pk: "alice@example.com", other.pk: "bob@example.com"}
    assert sorted((m["To"], m["Message-ID"]) for m in built) == sorted(
        [(to, f"<reminder-{pk}@reminders.example.com>") for pk, to in by_pk.items()] * 2
    )
    assert {m["Auto-Submitted"] for m in built} == {"auto-generated"}

    settings.SEND_REMINDERS_MESSAGE_ID_DOMAIN = ""
    assert message_id(reminder) == f"<reminder-{reminder.pk}@{DNS_NAME}>"


def test_control_characters_in_a_contest_name_never_reach_the_subject_or_body(alice, mailoutbox):
    """ESC (a terminal escape), BEL, DEL, a C1 control, line breaks: a name from the API
    cannot colour a mail client's terminal or add a header or a line."""
    name = "Round\x1b[31m 5\x07 (Div.\x7f 2)\r\nBcc: x@evil.example\x85\u2028end\tof name"
    contest = make_contest(1900, start=timedelta(hours=1), name=name)
    make_reminder(alice, contest, at=-timedelta(minutes=1))

    assert deliver_due_reminders().sent == 1

    [message] = mailoutbox
    cleaned = "Round[31m 5 (Div. 2) Bcc: x@evil.example end of name"
    assert message.subject.startswith(f"Reminder: {cleaned} starts ")
    assert message.body.startswith(f"{cleaned} starts on ")
    text = message.message().as_string()
    assert not [
        ch for ch in message.subject + message.body.replace("\n", "") if ch < " " or "\x7f" <= ch <= "\x9f"
    ]
    assert "\nBcc:" not in text
    assert one_line(" a\x1b\x00b \n\n c\x9b ") == "ab c"  # NUL too (the sync never stores it)


def test_not_yet_due_and_stale_reminders_send_nothing(soon, alice, mailoutbox):
    make_reminder(alice, soon, at=timedelta(minutes=30))
    make_reminder(alice, make_contest(2, start=-timedelta(minutes=1)), at=-timedelta(hours=1))
    make_reminder(
        alice, make_contest(3, start=timedelta(days=1), removed_at=timezone.now()), at=-timedelta(hours=1)
    )

    assert deliver_due_reminders().as_dict() == NOTHING
    assert mailoutbox == []
    assert not Reminder.objects.exclude(claimed_by="").exists()


def test_a_user_without_an_email_address_is_skipped_counted_and_not_due_again(soon, alice, mailoutbox):
    bob = make_user("bob", email="")
    make_reminder(alice, soon, at=-timedelta(minutes=1))
    skipped = make_reminder(bob, soon, at=-timedelta(minutes=1))

    assert deliver_due_reminders().as_dict() == stats(due=2, sent=1, skipped=1)
    assert [m.to for m in mailoutbox] == [["alice@example.com"]]
    assert state(skipped) == (0, False, False, True, False)  # failed, no attempt used
    assert skipped.last_error == "not sent: the user has no email address"
    assert deliver_due_reminders().due == 0

    # Once bob has an address, the admin's retry action makes it pending again.
    bob.email = "bob@example.com"
    bob.save()
    assert retry_reminders(reminders=Reminder.objects.all()) == 1
    assert deliver_due_reminders().as_dict() == stats(due=1, sent=1)
    assert mailoutbox[-1].to == ["bob@example.com"]


def test_one_update_claims_a_batch_for_one_claim_id_and_costs_no_attempt(soon):
    due_reminders(5, contest=soon)
    make_reminder(make_user("later"), soon, at=timedelta(minutes=5))  # not due: never claimed

    with CaptureQueriesContext(connection) as queries:
        first = claim_batch(run="host:1:aaaaaa/r", claim="host:1:aaaaaa/r.1", limit=3, max_attempts=5)
    assert first == 3
    [update] = queries.captured_queries
    assert update["sql"].startswith("UPDATE ")
    assert claim_batch(run="host:2:bbbbbb/r", claim="host:2:bbbbbb/r.1", limit=3, max_attempts=5) == 2
    assert claim_batch(run="host:3:cccccc/r", claim="host:3:cccccc/r.1", limit=3, max_attempts=5) == 0

    claims = Counter(Reminder.objects.values_list("claimed_by", flat=True))
    assert claims == {"host:1:aaaaaa/r.1": 3, "host:2:bbbbbb/r.1": 2, "": 1}
    assert set(Reminder.objects.exclude(claimed_by="").values_list("attempts", flat=True)) == {0}
    assert Reminder.objects.filter(claimed_until__gt=timezone.now() + timedelta(minutes=9)).count() == 5


def test_claims_take_the_soonest_contest_first_then_the_oldest_reminder(alice):
    later = make_contest(1, start=timedelta(days=1))
    sooner = make_contest(2, start=timedelta(minutes=20))
    old_for_later = make_reminder(alice, later, at=-timedelta(hours=3))
    new_for_sooner = make_reminder(alice, sooner, at=-timedelta(minutes=1))
    old_for_sooner = make_reminder(alice, sooner, at=-timedelta(minutes=5))

    order = []
    for n in range(1, 4):
        assert claim_batch(run="h", claim=f"h.{n}", limit=1, max_attempts=5) == 1
        order.append(Reminder.objects.get(claimed_by=f"h.{n}"))

    assert order == [old_for_sooner, new_for_sooner, old_for_later]


def test_a_reminder_claimed_by_another_run_waits_until_its_claim_expires(soon, alice, mailoutbox):
    reminder = make_reminder(alice, soon, at=-timedelta(minutes=1))
    claim_batch(run="host:1:aaaaaa/r", claim="host:1:aaaaaa/r.1", limit=500, max_attempts=5)

    assert deliver_due_reminders().as_dict() == NOTHING
    assert mailoutbox == []

    # The claimer died; its claim runs out (written into the past, database clock).
    Reminder.objects.filter(pk=reminder.pk).update(claimed_until=Now() - timedelta(seconds=1))

    assert deliver_due_reminders().as_dict() == stats(due=1, sent=1)
    assert state(reminder) == (1, *DELIVERED)


def test_claims_records_and_reads_stay_under_a_tenth_of_a_query_per_reminder(soon, settings, mailoutbox):
    """1,000 due reminders: a few batch claims and reads back, one record per group of
    RECORD_EVERY. The old code sent two UPDATEs per reminder (2,000 statements)."""
    settings.SEND_REMINDERS_BATCH = 400
    many_due_reminders(1000, contest=soon)

    with CaptureQueriesContext(connection) as queries:
        done = deliver_due_reminders()

    assert done.as_dict() == stats(due=1000, sent=1000)
    assert len(mailoutbox) == 1000
    statements = [q["sql"] for q in queries.captured_queries]
    claims = [sql for sql in statements if sql.startswith("UPDATE") and "LIMIT 400" in sql]
    # (On PostgreSQL the read is a server-side cursor: DECLARE … CURSOR FOR SELECT.)
    readbacks = [
        sql for sql in statements if re.match(r"(DECLARE .* CURSOR FOR )?SELECT .*\"claimed_by\" = ", sql)
    ]
    # Three batches (400, 400, 200), then the claim that finds nothing left.
    assert len(claims) == 4
    assert len(readbacks) == 3
    assert len(statements) <= 100, Counter(sql.split()[0] for sql in statements)
    assert Reminder.objects.filter(delivered_at__isnull=False, attempts=1).count() == 1000


def test_reminders_that_fall_due_during_a_run_are_claimed_by_that_run(
    soon, settings, monkeypatch, mailoutbox
):
    """The run claims until nothing due is left, so the next minute's reminders do not wait
    for the next run while a big one works (docs/reminders.md, "A big round")."""
    settings.SEND_REMINDERS_BATCH = 2
    due_reminders(4, contest=soon)
    latecomer = make_reminder(make_user("late"), soon, at=timedelta(minutes=30))
    real_claim = reminders.claim_batch

    def claim_then_time_passes(**kwargs):
        claimed = real_claim(**kwargs)
        # After the first batch: the latecomer's time comes (written into the past).
        Reminder.objects.filter(pk=latecomer.pk).update(remind_at=Now() - timedelta(seconds=1))
        return claimed

    monkeypatch.setattr(reminders, "claim_batch", claim_then_time_passes)

    assert deliver_due_reminders().as_dict() == stats(due=5, sent=5)
    assert "late@example.com" in [m.to[0] for m in mailoutbox]
    assert state(latecomer) == (1, *DELIVERED)


def test_a_refused_recipient_records_its_error_and_is_retried_up_to_the_attempt_limit(soon, settings, server):
    settings.SEND_REMINDERS_MAX_ATTEMPTS = 3
    refused = make_reminder(make_user("ghost"), soon, at=-timedelta(minutes=2))
    accepted = make_reminder(make_user("alice"), soon, at=-timedelta(minutes=1))
    server.refused.add("ghost@example.com")

    assert deliver_due_reminders().as_dict() == stats(due=2, sent=1, failed=1)
    assert server.accepted == {"alice@example.com": 1}  # the batch went on
    assert state(refused) == (1, *PENDING)  # a clear refusal: free for another attempt
    assert refused.last_error.startswith("attempt 1: SMTPRecipientsRefused: ")
    assert "550" in refused.last_error and "no such user" in refused.last_error
    assert list(Reminder.objects.due()) == [refused]

    for _attempt in (2, 3):  # refused all it tried: a failed run (issue 35)
        with pytest.raises(ReminderDeliveryError, match=r"refused every message of this run .* failed=1 "):
            deliver_due_reminders()
    assert state(refused) == (3, False, False, True, False)  # the third refusal gives it up
    assert refused.last_error.startswith("attempt 3: SMTPRecipientsRefused")
    assert deliver_due_reminders().due == 0
    assert state(accepted) == (1, *DELIVERED)


def test_a_run_tries_each_reminder_once_and_the_next_run_again_even_under_the_same_holder(soon, server):
    """A refused reminder is free again at once, but the run that was refused leaves it to
    the next run (it claims on until nothing is due); a caller that hands the same holder
    to every run still gets one try per run."""
    refused = make_reminder(make_user("ghost"), soon, at=-timedelta(minutes=2))
    server.refused.add("ghost@example.com")
    lease = a_lease(holder="same:1:aaaaaa")

    for _run in range(2):
        with pytest.raises(ReminderDeliveryError, match=r"; due=1 sent=0 failed=1 uncertain=0 skipped=0; "):
            deliver_due_reminders(lease=lease)

    assert state(refused) == (2, *PENDING)


def test_a_run_whose_every_message_the_server_refused_fails_and_records_each_refusal(soon, server):
    """Issue 35, item 17: expired credentials (550 to every recipient) made a run succeed that
    delivered nothing; only each reminder's attempts rose."""
    ghosts = [make_reminder(make_user(name), soon, at=-timedelta(minutes=2)) for name in ("ghost", "spook")]
    server.refused.update({"ghost@example.com", "spook@example.com"})

    with pytest.raises(ReminderDeliveryError) as failed:
        deliver_due_reminders()

    assert str(failed.value).startswith(
        "the mail server refused every message of this run (SMTPRecipientsRefused: "
    )
    assert "; due=2 sent=0 failed=2 uncertain=0 skipped=0; " in str(failed.value)
    assert [state(ghost) for ghost in ghosts] == [(1, *PENDING)] * 2  # each refusal recorded
    server.refused.discard("spook@example.com")  # one gets through: the run did its work
    assert deliver_due_reminders().as_dict() == stats(due=2, sent=1, failed=1)


@pytest.mark.parametrize(
    ("where", "reply"),
    [
        ("data_command_reply", "554 5.3.0 no more messages today"),
        ("data_command_reply", "451 4.3.0 try again later"),
        ("data_reply", "554 5.7.1 rejected as spam"),
        ("data_reply", "451 4.7.1 greylisted, try again later"),
    ],
)
def test_a_4xx_or_5xx_to_data_is_a_refusal_and_the_batch_goes_on(soon, server, where, reply):
    refused = make_reminder(make_user("ghost"), soon, at=-timedelta(minutes=3))
    after = make_reminder(make_user("alice"), soon, at=-timedelta(minutes=1))
    getattr(server, where)["ghost@example.com"] = reply

    assert deliver_due_reminders().as_dict() == stats(due=2, sent=1, failed=1)

    assert state(refused) == (1, *PENDING)
    assert refused.last_error.startswith(f"attempt 1: SMTPDataError: ({reply[:3]}, ")
    assert state(after) == (1, *DELIVERED)  # the next message on the same connection went through
    assert server.sessions == 1

    getattr(server, where).clear()  # the server takes it now
    assert deliver_due_reminders().as_dict() == stats(due=1, sent=1)
    assert state(refused) == (2, *DELIVERED)


@pytest.mark.parametrize("behaviour", ["late", "drop_after_data"])
def test_a_lost_answer_after_data_leaves_the_reminder_uncertain_and_it_is_never_sent_again(
    soon, settings, server, behaviour
):
    """Issue 17, item 3: the server has the message, its answer is lost (it comes after
    EMAIL_TIMEOUT, or the connection drops). The old code took it as "not sent" and the
    next runs sent it again, up to SEND_REMINDERS_MAX_ATTEMPTS times."""
    settings.EMAIL_TIMEOUT = 1
    first = make_reminder(make_user("first"), soon, at=-timedelta(minutes=3))
    lost = make_reminder(make_user("lost"), soon, at=-timedelta(minutes=2))
    last = make_reminder(make_user("last"), soon, at=-timedelta(minutes=1))
    getattr(server, behaviour).add("lost@example.com")

    with pytest.raises(ReminderDeliveryError) as excinfo:
        deliver_due_reminders()

    assert str(excinfo.value).startswith(
        "connection 1: the mail server connection failed: SMTPServerDisconnected"
    )
    assert "due=3 sent=1 failed=0 uncertain=1 skipped=0" in str(excinfo.value)
    assert state(first) == (1, *DELIVERED)
    assert state(lost) == (1, *UNCERTAIN)
    assert lost.last_error.startswith(
        "attempt 1: outcome unknown, the message went out but the mail server's"
    )
    assert "it may have been delivered, so it is not sent again by itself" in lost.last_error
    assert state(last) == (0, *PENDING)  # released unsent: no attempt used
    assert last.last_error.startswith("not sent yet: the mail server connection failed: ")

    for _ in range(3):  # later runs, the server behaving again
        server.late.clear()
        server.drop_after_data.clear()
        deliver_due_reminders()

    assert server.received == {"first@example.com": 1, "lost@example.com": 1, "last@example.com": 1}
    assert state(lost) == (1, *UNCERTAIN)
    assert state(last) == (1, *DELIVERED)

    # Only the admin's retry sends it again (the user may then get it twice).
    assert retry_reminders(reminders=Reminder.objects.filter(pk=lost.pk)) == 1
    assert deliver_due_reminders().as_dict() == stats(due=1, sent=1)
    assert server.received["lost@example.com"] == 2
    assert state(lost) == (1, *DELIVERED)


def test_a_server_that_drops_the_connection_after_100_messages_leaves_the_rest_pending(soon, server):
    many_due_reminders(150, contest=soon)
    server.drop_after = 100

    with pytest.raises(ReminderDeliveryError) as excinfo:
        deliver_due_reminders()

    message = str(excinfo.value)
    assert message.startswith("connection 1: the mail server connection failed: SMTPServerDisconnected")
    assert message.endswith("its unsent reminders wait for the next run, no attempt used")
    assert sum(server.received.values()) == 100
    delivered = Reminder.objects.filter(delivered_at__isnull=False)
    rest = Reminder.objects.filter(delivered_at__isnull=True)
    assert (delivered.count(), set(delivered.values_list("attempts", flat=True))) == (100, {1})
    assert rest.count() == 50
    assert set(rest.values_list("attempts", "claimed_until", "uncertain_at", "failed_at")) == {
        (0, None, None, None)
    }
    assert {e.split(":")[0] for e in rest.values_list("last_error", flat=True)} == {"not sent yet"}

    assert deliver_due_reminders().as_dict() == stats(due=50, sent=50)
    assert set(server.received.values()) == {1}
    assert len(server.received) == 150


def test_an_unreachable_mail_server_stops_the_run_and_uses_no_attempt(soon, alice, settings):
    reminder = make_reminder(alice, soon, at=-timedelta(minutes=1))
    settings.EMAIL_BACKEND = SMTP
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", closed_port()

    with pytest.raises(ReminderDeliveryError) as excinfo:
        deliver_due_reminders()

    assert str(excinfo.value).startswith(
        "not sent yet: the mail server is unreachable: ConnectionRefusedError"
    )
    assert str(excinfo.value).endswith("1 due reminders wait for the next run, no attempt used")
    assert state(reminder) == (0, *PENDING)
    assert reminder.last_error.startswith("not sent yet: the mail server is unreachable")
    assert list(Reminder.objects.due()) == [reminder]


def test_a_run_that_died_on_the_last_attempt_leaves_the_reminder_uncertain(soon, alice, mailoutbox, settings):
    settings.SEND_REMINDERS_MAX_ATTEMPTS = 2
    reminder = make_reminder(alice, soon, at=-timedelta(minutes=1), attempts=2)
    Reminder.objects.filter(pk=reminder.pk).update(
        claimed_until=Now() - timedelta(seconds=1), claimed_by="dead:1:cccccc/r.1"
    )

    assert deliver_due_reminders().as_dict() == stats(due=1, uncertain=1)

    assert mailoutbox == []
    assert state(reminder) == (2, *UNCERTAIN)
    assert reminder.last_error == (
        "attempt 2, the last one allowed, never recorded its outcome (its run stopped): "
        "its email may have gone out, so it is not sent again by itself"
    )


def test_a_lost_lease_stops_the_run_before_the_next_claim(soon, alice, mailoutbox):
    reminder = make_reminder(alice, soon, at=-timedelta(minutes=1))
    lease = a_lease(holder="host:1:aaaaaa")
    lease.mark_lost("taken over by host:2:bbbbbb")

    with pytest.raises(LockLost, match="taken over by host:2:bbbbbb"):
        deliver_due_reminders(lease=lease)

    assert mailoutbox == []
    assert state(reminder) == (0, *PENDING)


def test_a_lease_lost_mid_batch_stops_before_the_next_message_and_releases_the_rest(
    soon, monkeypatch, mailoutbox
):
    many_due_reminders(120, contest=soon)
    lease = a_lease(holder="h:1:aaaaaa")
    real_send = senders.send_reminder

    def send_then_lose_the_lease(**kwargs):
        if len(mailoutbox) == 30:
            lease.mark_lost("ran longer than its maximum run time")
        return real_send(**kwargs)

    monkeypatch.setattr(senders, "send_reminder", send_then_lose_the_lease)

    with pytest.raises(LockLost):
        deliver_due_reminders(lease=lease)

    # The message in flight when the heartbeat gave up is the last one.
    assert len(mailoutbox) == 31
    assert Reminder.objects.filter(delivered_at__isnull=False, attempts=1).count() == 31
    rest = Reminder.objects.filter(delivered_at__isnull=True)
    assert set(rest.values_list("attempts", "claimed_until")) == {(0, None)}  # its group's too
    assert rest.count() == 120 - 31
    assert {e for e in rest.values_list("last_error", flat=True)} == {
        "not sent yet: the run stopped: LockLost: ran longer than its maximum run time"
    }


def test_reminders_another_run_took_are_dropped_before_their_message_with_one_warning(
    soon, settings, monkeypatch, mailoutbox, caplog
):
    """Issue 28, item 2, in one process: while the 20th message goes out, another run holds
    15 of the batch (5 of this group, 10 of the next: what it does once this run's claims
    expired). The renewal before the next message (here before each one: a claim TTL of 0)
    finds them gone: they are dropped, with one WARNING, and the rest goes out."""
    settings.SEND_REMINDERS_BATCH, settings.SEND_REMINDERS_CLAIM_TTL = 100, 0
    pks = sorted(many_due_reminders(100, contest=soon))  # the claim's order: one contest, one time
    real_send = senders.send_reminder
    taken = pks[30:35] + pks[60:70]

    def send_while_another_run_takes_over(**kwargs):
        if len(mailoutbox) == 19:
            Reminder.objects.filter(pk__in=taken).update(
                claimed_by="other:1:ffffff/aaaaaa.1", claimed_until=Now() + timedelta(minutes=10)
            )
        return real_send(**kwargs)

    monkeypatch.setattr(senders, "send_reminder", send_while_another_run_takes_over)

    assert deliver_due_reminders().as_dict() == stats(due=100, sent=85)

    assert sorted(m.to[0] for m in mailoutbox) == sorted(
        Reminder.objects.exclude(pk__in=taken).values_list("user__email", flat=True)
    )
    assert Reminder.objects.filter(pk__in=taken, delivered_at__isnull=True).count() == 15
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1
    assert re.fullmatch(
        r"claim=\S+ 15 of its reminders are no longer its own \(.*\): dropped, not sent", warnings[0]
    )


def test_each_group_start_counts_what_is_still_its_own_and_drops_only_that(
    soon, settings, monkeypatch, mailoutbox, caplog
):
    """No renewal falls due here (the default TTL); the second group's start, which counts
    its attempts and extends its claims, finds 10 of its 50 taken: those 10 are dropped, the
    third group is untouched."""
    settings.SEND_REMINDERS_BATCH = 150
    pks = sorted(many_due_reminders(150, contest=soon))  # the claim's order: one contest, one time
    real_send = senders.send_reminder
    taken = pks[60:70]

    def send_while_another_run_takes_over(**kwargs):
        if len(mailoutbox) == 10:
            Reminder.objects.filter(pk__in=taken).update(claimed_by="other:1:ffffff/aaaaaa.1")
        return real_send(**kwargs)

    monkeypatch.setattr(senders, "send_reminder", send_while_another_run_takes_over)

    assert deliver_due_reminders().as_dict() == stats(due=150, sent=140)

    assert set(Reminder.objects.filter(delivered_at__isnull=True).values_list("pk", flat=True)) == set(taken)
    assert set(Reminder.objects.filter(pk__in=taken).values_list("attempts", flat=True)) == {0}  # not tried
    warnings = [r.getMessage() for r in caplog.records if r.levelname == "WARNING"]
    assert len(warnings) == 1 and " 10 of its reminders are no longer its own " in warnings[0]


def test_the_dry_run_counts_and_changes_nothing(soon, alice, mailoutbox):
    due_reminders(3, contest=soon)
    make_reminder(make_user("bob", email=""), soon, at=-timedelta(minutes=1))

    with CaptureQueriesContext(connection) as queries:
        assert deliver_due_reminders(dry_run=True).as_dict() == stats(due=4, skipped=1)

    assert len(queries) == 2
    assert mailoutbox == []
    assert not Reminder.objects.exclude(claimed_by="").exists()
    assert not Reminder.objects.filter(failed_at__isnull=False).exists()


def test_one_smtp_connection_serves_the_whole_run(soon, settings, server):
    settings.SEND_REMINDERS_BATCH = 2
    due_reminders(5, contest=soon)

    assert deliver_due_reminders().sent == 5

    assert server.sessions == 1
    assert {m["To"] for m in server.messages} == {f"user{n}@example.com" for n in range(5)}
    assert {m["From"] for m in server.messages} == {"reminders@localhost"}


def test_the_project_sends_through_the_staged_smtp_backend_and_leaves_the_others_alone(settings):
    settings.EMAIL_BACKEND = SMTP
    assert type(reminder_backend()) is StagedSMTPBackend
    for other in ("console", "filebased", "locmem"):
        settings.EMAIL_BACKEND = f"django.core.mail.backends.{other}.EmailBackend"
        assert type(reminder_backend()).__module__ == f"django.core.mail.backends.{other}"


def test_where_a_limited_subquery_is_not_allowed_keys_are_read_first_with_the_same_result(
    soon, settings, mailoutbox, monkeypatch
):
    """MongoDB's path (``allow_sliced_subqueries_with_in`` is False there: no LIMIT in an
    ``IN`` subquery, no UPDATE across collections), run on this SQL database: each claim
    reads its keys, then one UPDATE by key re-checks them; same deliveries, same counts."""
    monkeypatch.setattr(connection.features, "allow_sliced_subqueries_with_in", False)
    settings.SEND_REMINDERS_BATCH = 4
    due_reminders(10, contest=soon)
    exhausted = make_reminder(make_user("tired"), soon, at=-timedelta(minutes=1), attempts=5)

    with CaptureQueriesContext(connection) as queries:
        done = deliver_due_reminders()

    assert done.as_dict() == stats(due=11, sent=10, failed=1)
    assert len(mailoutbox) == 10
    assert state(exhausted) == (5, False, False, True, False)
    updates = [q["sql"] for q in queries.captured_queries if q["sql"].startswith("UPDATE")]
    assert not [sql for sql in updates if "SELECT" in sql]  # every UPDATE matches keys only
    assert Reminder.objects.filter(delivered_at__isnull=False, attempts=1).count() == 10


# --- several connections (threads): each its own database connection, so committed data --


@pytest.fixture
def committed(transactional_db):
    return make_contest(1843, start=timedelta(hours=2))


def test_several_connections_share_the_work_and_send_each_reminder_once(committed, settings, server):
    """The run claims and builds; each message goes to whichever connection is free (a
    server that takes 5 ms a message keeps each busy for a while)."""
    settings.SEND_REMINDERS_CONNECTIONS, settings.SEND_REMINDERS_BATCH = 3, 7
    many_due_reminders(90, contest=committed)
    server.reply_delay = 0.005

    assert deliver_due_reminders().as_dict() == stats(due=90, sent=90)

    assert server.sessions == 3
    assert len(server.received) == 90 and set(server.received.values()) == {1}
    assert sum(server.per_session.values()) == 90 and min(server.per_session.values()) >= 10
    claims = set(Reminder.objects.values_list("claimed_by", flat=True))
    # 13 batches of 7 (the last of 6), claimed one after another by the run.
    assert {claim.rsplit(".", 1)[1] for claim in claims} == {str(n) for n in range(1, 14)}


def test_connections_open_only_for_messages_to_send(committed, settings, server):
    """Two due reminders, four connections: the connections that get no message never
    connect; nothing due, none does (issue 28, items 1 and 5)."""
    settings.SEND_REMINDERS_CONNECTIONS = 4
    assert deliver_due_reminders().as_dict() == NOTHING
    assert server.sessions == 0

    many_due_reminders(2, contest=committed)
    server.reply_delay = 0.05  # the first connection is still busy when the second message comes

    assert deliver_due_reminders().as_dict() == stats(due=2, sent=2)
    assert server.sessions == 2


def test_a_connection_that_fails_mid_batch_hands_its_message_to_the_others(committed, settings, server):
    """The first connection's session is dropped after 10 messages: its next message never
    went out, so the other connection sends it, and everything else; the run then fails,
    naming the connection it lost, so that the operator sees it."""
    settings.SEND_REMINDERS_CONNECTIONS, settings.SEND_REMINDERS_BATCH = 2, 30
    many_due_reminders(100, contest=committed)
    server.drop_after, server.drop_sessions = 10, {1}

    with pytest.raises(ReminderDeliveryError) as excinfo:
        deliver_due_reminders()

    assert re.fullmatch(
        r"connection [12]: the mail server connection failed: SMTPServerDisconnected: .*; "
        r"due=100 sent=100 failed=0 uncertain=0 skipped=0; its unsent reminders wait for the next run, "
        r"no attempt used",
        str(excinfo.value),
    )
    assert len(server.received) == 100 and set(server.received.values()) == {1}
    assert server.per_session[1] == 10 and server.per_session[2] == 90
    # The handed-over one too: one attempt each (the lost connection never sent it).
    assert Reminder.objects.filter(delivered_at__isnull=False, attempts=1).count() == 100


def test_when_every_connection_fails_the_rest_is_released_with_no_attempt_used(committed, settings, server):
    settings.SEND_REMINDERS_CONNECTIONS, settings.SEND_REMINDERS_BATCH = 2, 30
    many_due_reminders(100, contest=committed)
    server.drop_after = 10  # each session: 10 messages, then the server hangs up

    with pytest.raises(ReminderDeliveryError) as excinfo:
        deliver_due_reminders()

    assert re.match(
        r"connection 1: the mail server connection failed: .*; connection 2: ", str(excinfo.value)
    )
    assert sum(server.received.values()) == 20
    rest = Reminder.objects.filter(delivered_at__isnull=True)
    assert rest.count() == 80
    assert set(rest.values_list("attempts", "claimed_until")) == {(0, None)}
    claimed = rest.exclude(claimed_by="")  # the batches it had claimed; the rest it never took
    assert {e.split(":")[0] for e in claimed.values_list("last_error", flat=True)} == {"not sent yet"}


def test_a_claim_that_waited_for_another_runs_rows_takes_the_next_ones_on_postgresql(committed):
    """READ COMMITTED: run B's claim starts while run A's claim of the same first rows is
    not yet committed. B's subquery picks those rows too and waits for A's row locks;
    once A commits, PostgreSQL re-checks B's WHERE on the new rows: they are claimed now,
    so B takes none of them (without that re-check it would take all five again), comes
    back empty, and its retry claims the next five."""
    if connection.vendor != "postgresql":
        pytest.skip(
            "PostgreSQL only: SQLite has one writer at a time, so a second claim starts after the first "
            "committed and its subquery sees it (test_two_concurrent_runs_over_5000_… races real runs on both)"
        )
    pks = many_due_reminders(10, contest=committed)
    claimed, a_claimed, a_may_commit = {}, threading.Event(), threading.Event()

    def run(name: str) -> None:
        try:
            with transaction.atomic():
                claimed[name] = claim_batch(run=name, claim=f"{name}.1", limit=5, max_attempts=5)
                if name == "a":
                    a_claimed.set()
                    a_may_commit.wait(30)
        finally:
            connections.close_all()

    a = threading.Thread(target=run, args=("a",))
    a.start()
    assert a_claimed.wait(30)
    b = threading.Thread(target=run, args=("b",))
    b.start()
    deadline = time.monotonic() + 30
    waiting = 0
    while not waiting and time.monotonic() < deadline:  # until B waits on A's row locks
        with connection.cursor() as cursor:
            cursor.execute(
                "SELECT count(*) FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE 'UPDATE%%'"
            )
            waiting = cursor.fetchone()[0]
        time.sleep(0.02)
    a_may_commit.set()
    a.join(30)
    b.join(30)

    assert waiting == 1
    assert claimed == {"a": 5, "b": 5}
    by_claim = {claim: set(pks) for claim, pks in _claims().items()}
    assert by_claim == {"a.1": set(pks[:5]), "b.1": set(pks[5:])}


def _claims() -> dict[str, list[int]]:
    found: dict[str, list[int]] = {}
    for pk, claim in Reminder.objects.order_by("pk").values_list("pk", "claimed_by"):
        found.setdefault(claim, []).append(pk)
    return found


# --- settings and checks -------------------------------------------------------------


def _ids() -> set[str]:
    return {message.id for message in run_checks()}


def test_the_default_settings_pass_the_reminder_checks(settings):
    settings.DEBUG = True  # as DJANGO_DEBUG=1 leaves it (the test runner turns it off): SITE_URL's default
    assert not {i for i in _ids() if i.startswith("contests.E")}


@pytest.mark.parametrize(
    ("name", "value", "code", "text"),
    [
        ("SEND_REMINDERS_CLAIM_TTL", 30, "contests.E005", "must be more than three times EMAIL_TIMEOUT"),
        ("SEND_REMINDERS_MAX_ATTEMPTS", 0, "contests.E006", "must be 1 or more, got 0"),
        ("SEND_REMINDERS_BATCH", 0, "contests.E007", "must be between 1 and 10,000, got 0"),
        ("SEND_REMINDERS_CONNECTIONS", 33, "contests.E008", "must be between 1 and 32, got 33"),
        ("SEND_REMINDERS_MESSAGE_ID_DOMAIN", "mail example>", "contests.E009", "must be a domain name"),
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
        "s.EMAIL_USE_TLS, s.EMAIL_TIMEOUT, s.DEFAULT_FROM_EMAIL, s.SEND_REMINDERS_BATCH, "
        "s.SEND_REMINDERS_CONNECTIONS)"
    )

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
        EMAIL_URL="smtp+tls://mailer:s%40cret@mail.example.com:587",
        DEFAULT_FROM_EMAIL="cf@example.com",
        SEND_REMINDERS_CONNECTIONS="4",
    )
    assert good.stdout.split() == [
        SMTP, "mail.example.com", "587", "mailer", "s@cret", "True", "10", "cf@example.com", "500", "4"
    ]  # fmt: skip
    assert run().stdout.split()[0] == "django.core.mail.backends.console.EmailBackend"  # DJANGO_DEBUG=1

    bad = manage("check", env=project_env(EMAIL_URL="smtp://mailer:s3cret@mail.example.com:25x"))
    assert bad.returncode == 1
    assert re.search(r"ImproperlyConfigured: EMAIL_URL: Port could not be cast", bad.stderr), bad.stderr
    assert "s3cret" not in bad.stderr.splitlines()[-1]
