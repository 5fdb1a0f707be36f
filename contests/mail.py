"""The reminder email: building it, handing it to the mail server, telling what became of it.

A send that fails can mean three different things (docs/reminders.md, "Unknown is not
failed"): the server refused this message (a 4xx/5xx reply to MAIL, RCPT or DATA), the
message never left (the connection failed before its content was sent), or nobody knows
(the content went out, then the reply never came: a timeout, a dropped connection). Only
the SMTP conversation can tell the last two apart, so Django's SMTP backend is used through
a subclass whose connection records how far each message got. Every ``EMAIL_URL`` scheme
(smtp, smtp+tls, smtp+ssl) is that same backend; the console, file and in-memory backends
are used as they are.
"""

from __future__ import annotations

import contextlib
import enum
import functools
import smtplib
import unicodedata
from dataclasses import dataclass
from datetime import UTC, datetime

from django.conf import settings
from django.core.mail import EmailMessage
from django.core.mail.backends import smtp
from django.core.mail.backends.base import BaseEmailBackend
from django.core.mail.message import sanitize_address
from django.core.mail.utils import DNS_NAME
from django.utils.module_loading import import_string
from django.utils.timesince import timeuntil

from contests.models import Reminder
from contests.text import error_text
from contests.unsubscribe import EVERY_CONTEST, list_unsubscribe_headers, make_token, unsubscribe_url

# How far the last message got on an SMTP connection.
ENVELOPE = "envelope"  # MAIL and RCPT (and the greeting before them)
DATA = "data"  # the DATA command, waiting for its 354
CONTENT = "content"  # 354 received: the message is being sent
SENT = "sent"  # the message and its final "." are out: only the server knows what it did

# Replies that refuse this message (the connection stays usable; smtplib resets it), and
# a message Django cannot even build (a bad address): a try that did not deliver.
REFUSALS = (smtplib.SMTPSenderRefused, smtplib.SMTPRecipientsRefused, smtplib.SMTPDataError, ValueError)


def one_line(text: str) -> str:
    """Text from outside (a contest name) fit for a header or one line of the body:
    control characters (Unicode category Cc: ESC, NUL, DEL, the C1 set …) are dropped,
    line breaks and other whitespace between words become one space."""
    kept = (" " if ch.isspace() else ch for ch in text if ch.isspace() or unicodedata.category(ch) != "Cc")
    return " ".join("".join(kept).split())


def message_id(reminder: Reminder) -> str:
    """The reminder's one Message-ID, the same on every send of it (by any host, when
    ``SEND_REMINDERS_MESSAGE_ID_DOMAIN`` is set), so that a receiver takes a message sent again
    after a crash for the one it has (RFC 5322, 3.6.4)."""
    domain = settings.SEND_REMINDERS_MESSAGE_ID_DOMAIN or str(DNS_NAME)
    return f"<reminder-{reminder.pk}@{domain}>"


def reminder_message(*, reminder: Reminder, now: datetime | None = None) -> EmailMessage:
    """The email for ``reminder``: contest name, start time in UTC, Codeforces link, the
    links that stop reminders; its own Message-ID, ``Auto-Submitted`` (RFC 3834: no vacation
    or out-of-office replies) and a one-click unsubscribe (RFC 8058) from every reminder."""
    contest = reminder.contest
    subject, opening = _contest_text(contest.name, contest.start_time, contest.url, now)
    every = make_token(user_pk=reminder.user_id, contest_pk=EVERY_CONTEST)
    every_url = unsubscribe_url(every)
    this_url = unsubscribe_url(make_token(user_pk=reminder.user_id, contest_pk=reminder.contest_id))
    body = (
        f"{opening}"
        f"You get this email because {reminder.user.get_username()} asked for a reminder.\n"
        f"No more reminders for this contest: {this_url}\n"
        f"No more reminders at all: {every_url}\n"
    )
    headers = {
        "Message-ID": message_id(reminder),
        "Auto-Submitted": "auto-generated",
        **list_unsubscribe_headers(token=every, url=every_url),
    }
    return EmailMessage(subject=subject, body=body, to=[reminder.user.email], headers=headers)


@functools.lru_cache(maxsize=16)
def _contest_text(name: str, start_time: datetime, url: str, now: datetime | None) -> tuple[str, str]:
    """The subject and the opening lines, the same for every reminder of a contest read at
    one moment (a batch's reminders share the database clock of their read): made once."""
    name = one_line(name)
    start = start_time.astimezone(UTC)
    when = f"{start:%A %d %B %Y, %H:%M} UTC"
    until = timeuntil(start, now=now).replace("\xa0", " ")  # plain text: plain spaces
    return (
        f"Reminder: {name} starts {start:%Y-%m-%d %H:%M} UTC",
        f"{name} starts on {when}, in {until}.\n\nContest page: {url}\n\n",
    )


# --- handing it over -------------------------------------------------------------


class _Staged:
    """For ``smtplib.SMTP`` and ``SMTP_SSL``: ``stage`` says how far the last
    ``sendmail()`` got. smtplib's ``data()`` sends the DATA command, reads its 354,
    sends the message with its final "." in one ``send()``, then reads the reply; the
    hooks below follow those steps."""

    stage = ENVELOPE

    def sendmail(self, *args, **kwargs):
        self.stage = ENVELOPE
        return super().sendmail(*args, **kwargs)

    def data(self, msg):
        self.stage = DATA
        try:
            return super().data(msg)
        except smtplib.SMTPDataError:
            if self.stage == DATA:
                # A refused DATA command leaves the transaction open (smtplib resets it
                # after the other refusals, not this one): reset it for the next message.
                with contextlib.suppress(smtplib.SMTPServerDisconnected):
                    self.rset()
            raise

    def getreply(self):
        reply = super().getreply()
        if self.stage == DATA and reply[0] == 354:
            self.stage = CONTENT
        return reply

    def send(self, s):
        content = self.stage == CONTENT
        try:
            super().send(s)
        except OSError:
            raise  # the write failed, so the message's end (its final ".") did not go out
        except BaseException:
            if content:
                # Cut short by a signal (SIGTERM raises in the main thread), possibly once
                # every byte was written: the server may have all of it.
                self.stage = SENT
            raise
        if content:
            self.stage = SENT


class StagedSMTP(_Staged, smtplib.SMTP):
    pass


class StagedSMTPSSL(_Staged, smtplib.SMTP_SSL):
    pass


@dataclass(frozen=True)
class Flattened:
    """A message as an SMTP connection sends it: what Django's SMTP backend makes of an
    ``EmailMessage`` before its ``sendmail()``, made once, ahead, by whoever builds it."""

    sender: str
    recipients: list[str]
    data: bytes


def flatten(message: EmailMessage) -> Flattened:
    """``message``'s envelope and bytes, as Django's SMTP backend would send them. Raises
    ``ValueError`` for a message that cannot be sent (a bad address, a header with a newline)."""
    encoding = message.encoding or settings.DEFAULT_CHARSET
    recipients = [sanitize_address(address, encoding) for address in message.recipients()]
    data = message.message().as_bytes(linesep="\r\n")
    return Flattened(_sender(message.from_email, encoding), recipients, data)


@functools.lru_cache(maxsize=4)
def _sender(address: str, encoding: str) -> str:
    return sanitize_address(address, encoding)  # DEFAULT_FROM_EMAIL, the same for every message


class StagedSMTPBackend(smtp.EmailBackend):
    """Django's SMTP backend (plain, STARTTLS or implicit TLS, as configured), on a
    connection that records each message's stage; it also sends a message flattened ahead."""

    @property
    def connection_class(self):
        return StagedSMTPSSL if self.use_ssl else StagedSMTP

    def send_flattened(self, message: Flattened) -> bool:
        """Send ``message`` on the open connection, as ``send_messages`` sends one."""
        self.connection.sendmail(message.sender, message.recipients, message.data)
        return True


def reminder_backend_class() -> type[BaseEmailBackend]:
    """``EMAIL_BACKEND``, except that Django's own SMTP backend is its staged subclass."""
    backend_class = import_string(settings.EMAIL_BACKEND)
    return StagedSMTPBackend if backend_class is smtp.EmailBackend else backend_class


def reminder_backend() -> BaseEmailBackend:
    """A new backend for one connection (``reminder_backend_class``)."""
    return reminder_backend_class()(fail_silently=False)


class Outcome(enum.Enum):
    DELIVERED = "delivered"  # the server accepted it (or the backend wrote it)
    REFUSED = "refused"  # the server said no to this message: a try used, it may be tried again
    UNSENT = "unsent"  # the connection failed before the message could have been accepted
    UNCERTAIN = "uncertain"  # the message went out, its answer never came: never sent again by itself


@dataclass(frozen=True)
class Handover:
    outcome: Outcome
    error: str = ""

    @property
    def connection_lost(self) -> bool:
        """The connection cannot carry another message."""
        return self.outcome in {Outcome.UNSENT, Outcome.UNCERTAIN}


def hand_over(message: EmailMessage | Flattened, *, backend: BaseEmailBackend) -> Handover:
    """Send ``message`` on ``backend`` (already open) and say what became of it. A
    ``Flattened`` one goes to a ``StagedSMTPBackend``, an ``EmailMessage`` to any backend.

    Raises only what is not a mail error (a bug, ``SystemExit``); the caller learns the
    message's fate from ``stage_outcome()`` then.
    """
    if isinstance(getattr(backend, "connection", None), _Staged):
        backend.connection.stage = ENVELOPE  # a new message: nothing of it has gone out
    try:
        if isinstance(message, Flattened):
            sent = backend.send_flattened(message)
        else:
            message.connection = backend
            sent = message.send()
    except REFUSALS as exc:
        return Handover(Outcome.REFUSED, error_text(exc))
    except OSError as exc:  # smtplib's other errors, socket and TLS errors
        return Handover(stage_outcome(backend), error_text(exc))
    if not sent:
        return Handover(Outcome.REFUSED, "the email backend sent nothing")
    return Handover(Outcome.DELIVERED)


def stage_outcome(backend: BaseEmailBackend) -> Outcome:
    """What a send interrupted at this point did: unsent until the message's content
    went out, uncertain after; uncertain too on a backend that keeps no stages."""
    stage = getattr(getattr(backend, "connection", None), "stage", None)
    if stage is None or stage == SENT:
        return Outcome.UNCERTAIN
    return Outcome.UNSENT
