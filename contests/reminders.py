"""Reminder delivery: each due reminder claimed, emailed and recorded once.

What a crash at each step leaves behind is in docs/reminders.md.
"""

from __future__ import annotations

import logging
import smtplib
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta

from django.conf import settings
from django.core.mail import EmailMessage, get_connection
from django.core.mail.backends.base import BaseEmailBackend
from django.db.models import DateTimeField, ExpressionWrapper, F, Value
from django.db.models.functions import Now
from django.utils.timesince import timeuntil

from contests.models import Reminder
from locks.claims import Lease
from locks.leases import make_holder
from locks.text import error_text

logger = logging.getLogger(__name__)

# Refusals of one message: the server is fine, this message is not. Anything else
# an SMTP send raises is an OSError (smtplib's errors included): the connection is gone.
MESSAGE_ERRORS = (smtplib.SMTPRecipientsRefused, smtplib.SMTPResponseException, ValueError)


class ReminderDeliveryError(RuntimeError):
    """The mail server cannot be used: the run stops, what is left waits for the next one."""


@dataclass
class ReminderStats:
    due: int = 0
    sent: int = 0
    failed: int = 0
    skipped: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def reminder_message(*, reminder: Reminder, now: datetime | None = None) -> EmailMessage:
    """The email for ``reminder``: contest name, start time in UTC, Codeforces link."""
    contest = reminder.contest
    name = " ".join(contest.name.split())  # a header is one line
    start = contest.start_time.astimezone(UTC)
    when = f"{start:%A %d %B %Y, %H:%M} UTC"
    until = timeuntil(start, now=now).replace("\xa0", " ")  # plain text: plain spaces
    body = (
        f"{name} starts on {when}, in {until}.\n\n"
        f"Contest page: {contest.url}\n\n"
        f"You get this email because {reminder.user.get_username()} asked for a reminder.\n"
    )
    return EmailMessage(
        subject=f"Reminder: {name} starts {start:%Y-%m-%d %H:%M} UTC",
        body=body,
        to=[reminder.user.email],
    )


def deliver_due_reminders(
    *,
    now: datetime | None = None,
    connection: BaseEmailBackend | None = None,
    lease: Lease | None = None,
    dry_run: bool = False,
) -> ReminderStats:
    """Send every due reminder that no other run has claimed, each at most once.

    Per reminder: one conditional update claims it (count 1: this run's), then
    the email goes out on ``connection`` (one for the whole batch), then one
    update records ``delivered_at``; a refused message records ``last_error``
    and frees the claim for a later run, up to ``SEND_REMINDERS_MAX_ATTEMPTS``.
    ``now`` (default: the database clock) decides what is due. Raises
    ``ReminderDeliveryError`` when the mail server cannot be reached or drops
    the connection; ``LockLost`` when ``lease`` is lost (before the next claim).
    """
    stats = ReminderStats()
    max_attempts = settings.SEND_REMINDERS_MAX_ATTEMPTS
    candidates = list(
        Reminder.objects.due(now=now)
        .claimable()
        .select_related("user", "contest")
        .annotate(db_now=Now())
        .order_by("remind_at", "pk")
    )
    stats.due = len(candidates)
    if dry_run:
        stats.skipped = sum(1 for reminder in candidates if not reminder.user.email)
        return stats
    holder = lease.holder if lease is not None else make_holder()

    to_send = []
    for reminder in candidates:
        if not reminder.user.email:
            stats.skipped += _give_up(
                reminder, f"not sent: user {reminder.user.get_username()} has no email address"
            )
        elif reminder.attempts >= max_attempts:
            # Its last attempt claimed it and never recorded an outcome (the process died).
            stats.failed += _give_up(
                reminder,
                f"gave up after {reminder.attempts} attempts; the last one never recorded its outcome, "
                "so its email may have gone out",
            )
        else:
            to_send.append(reminder)
    if not to_send:
        return stats

    connection = connection or get_connection(fail_silently=False)
    opened = False
    try:
        try:
            opened = bool(connection.open())
        except OSError as exc:
            # Before any claim: an outage costs no attempt. The admin shows why they wait.
            error = f"not sent yet: the mail server is unreachable: {error_text(exc)}"
            Reminder.objects.filter(pk__in=[r.pk for r in to_send], delivered_at__isnull=True).update(
                last_error=error
            )
            raise ReminderDeliveryError(
                f"{error}; {len(to_send)} due reminders wait for the next run, no attempt used"
            ) from exc
        for reminder in to_send:
            if lease is not None:
                lease.check()
            if not claim_reminder(reminder=reminder, holder=holder, max_attempts=max_attempts):
                continue  # another run claimed it since the read
            attempt = reminder.attempts + 1
            try:
                sent = send_reminder(reminder=reminder, connection=connection, now=reminder.db_now)
            except MESSAGE_ERRORS as exc:
                sent, error = 0, f"attempt {attempt}: {error_text(exc)}"
            except OSError as exc:
                error = f"attempt {attempt}: the mail server connection failed: {error_text(exc)}"
                stats.failed += 1
                record_failure(reminder=reminder, holder=holder, error=error, max_attempts=max_attempts)
                raise ReminderDeliveryError(
                    f"{error}; sent={stats.sent} failed={stats.failed} skipped={stats.skipped}, "
                    "the rest wait for the next run"
                ) from exc
            else:
                error = f"attempt {attempt}: the email backend sent nothing"
            if sent:
                record_delivery(reminder=reminder)
                stats.sent += 1
            else:
                record_failure(reminder=reminder, holder=holder, error=error, max_attempts=max_attempts)
                stats.failed += 1
    finally:
        if opened:
            connection.close()
    return stats


def claim_reminder(*, reminder: Reminder, holder: str, max_attempts: int) -> bool:
    """One conditional update: True when this run, and no other, now holds the claim."""
    expires = ExpressionWrapper(
        Now() + Value(timedelta(seconds=settings.SEND_REMINDERS_CLAIM_TTL)), output_field=DateTimeField()
    )
    claimed = (
        Reminder.objects.filter(pk=reminder.pk, attempts__lt=max_attempts)
        .claimable()
        .update(claimed_until=expires, claimed_by=holder, attempts=F("attempts") + 1)
    )
    return claimed == 1


def send_reminder(*, reminder: Reminder, connection: BaseEmailBackend, now: datetime | None = None) -> int:
    """Hand the reminder's email to ``connection``; the number of messages sent (0 or 1)."""
    message = reminder_message(reminder=reminder, now=now)
    message.connection = connection
    return message.send()


def record_delivery(*, reminder: Reminder) -> None:
    recorded = Reminder.objects.filter(pk=reminder.pk, delivered_at__isnull=True).update(
        delivered_at=Now(), claimed_until=None, claimed_by=""
    )
    if not recorded:
        # Only after this run's claim expired mid-send and another run sent it too.
        logger.warning("reminder=%s was already recorded as delivered by another run", reminder.pk)


def record_failure(*, reminder: Reminder, holder: str, error: str, max_attempts: int) -> None:
    """Free this run's claim with the error; the last allowed attempt marks it failed."""
    mine = Reminder.objects.filter(pk=reminder.pk, claimed_by=holder, delivered_at__isnull=True)
    released = dict(claimed_until=None, claimed_by="", last_error=error)
    if not mine.filter(attempts__gte=max_attempts).update(failed_at=Now(), **released):
        mine.update(**released)


def _give_up(reminder: Reminder, error: str) -> int:
    """Mark an unclaimed reminder failed for good; 1 if this run did."""
    return (
        Reminder.objects.filter(pk=reminder.pk)
        .claimable()
        .update(failed_at=Now(), last_error=error, claimed_until=None, claimed_by="")
    )


def retry_reminders(*, reminders) -> int:
    """Make failed, undelivered reminders pending again (the admin's retry action)."""
    return reminders.filter(delivered_at__isnull=True, failed_at__isnull=False).update(
        failed_at=None, attempts=0, claimed_until=None, claimed_by=""
    )
