"""``check_jobs``: it judges every other registered job's ledger, opens and closes incidents in its
fenced write and emails ``ADMINS`` once at each (docs/architecture.md, "Alerts")."""

from __future__ import annotations

import contextlib
import logging
import smtplib
from dataclasses import dataclass, replace
from datetime import datetime, timedelta
from itertools import takewhile

from django.conf import settings
from django.core import mail
from django.core.mail import EmailMessage
from django.core.mail.backends import smtp
from django.db.models import Max, Q
from django.db.models.functions import Now

from locks.contrib.alerts.models import Incident
from locks.db import error_text
from locks.lease import FAILOVER_PAUSER, Lease, fenced, iso
from locks.models import JobPause, Outcome, SyncLock, now_plus
from locks.operator import ensure_lock_row
from locks.registry import SLOT_ERRORS, Job, jobs
from locks.status import Ledger, LockState, Slot, job_ledgers, jobs_health

logger = logging.getLogger(__name__)

SELF = "check_jobs"
# Slots of the ledger an email shows, newest first.
EMAIL_SLOTS = 12
# How long a claimed email stays claimed (more than a send can take): then another run takes it over.
CLAIM_TTL = timedelta(minutes=5)
CLAIMED, SENT, UNCERTAIN, NO_RECIPIENT = "claimed", "sent", "uncertain", "no recipient"


class AlertNotSent(RuntimeError):
    """An email the mail server refused (the next run sends it), or whose answer was lost (uncertain)."""


@dataclass(frozen=True)
class Problem:
    reason: str  # missed, failed, stale, error or failover
    summary: str


def judged(ledger: Ledger, *, since: datetime | None = None) -> list[Slot]:
    """The settled slots that count for an incident, newest first: paused ones count for nothing."""
    return [slot for slot in ledger.settled(since=since) if slot.outcome != Outcome.PAUSED]


def recovered(job: Job, ledger: Ledger) -> bool:
    """Whether its newest ``alert_after_recoveries`` counted slots all succeeded."""
    newest = [slot.outcome for slot in judged(ledger)[: job.alerts.recoveries]]
    return newest.count(Outcome.SUCCEEDED) == job.alerts.recoveries


CLOSE = "close"


def decide(
    job: Job,
    ledger: Ledger,
    *,
    incident_open: bool,
    paused: bool,
    since: datetime,
    last_success: datetime | None,
    resumed: datetime | None = None,
    failover: str = "",
) -> Problem | str | None:
    """What check_jobs does about ``job`` now: ``CLOSE`` the open incident once it recovered, or open
    one (its ``Problem``) for ``alert_after_failures`` failed or missed slots in a row (at or after
    ``resumed``), no success for ``alert_after`` since ``since``, or no slot; paused: nothing, unless
    a ``failover`` paused it (rule 16)."""
    if paused:
        return Problem("failover", failover) if failover and not incident_open else None
    if incident_open:
        return CLOSE if recovered(job, ledger) else None
    if ledger.error:
        return Problem("error", ledger.error)
    slots = judged(ledger, since=resumed)
    streak = list(takewhile(lambda slot: slot.outcome in {Outcome.FAILED, Outcome.MISSED}, slots))
    if streak and len(streak) >= job.alerts.failures:
        reason = Outcome.FAILED if any(slot.outcome == Outcome.FAILED for slot in streak) else Outcome.MISSED
        return Problem(reason, f"{len(streak)} slots {reason} in a row, since {streak[-1].describe()}")
    try:
        delay = job.alert_delay(now=ledger.db_now)
    except SLOT_ERRORS:
        return None  # the ledger said so above
    start = max(since, last_success) if last_success is not None else since
    if ledger.db_now - start > delay:
        what = f"its last success was at {iso(last_success)}" if last_success else "it never succeeded"
        return Problem("stale", f"no success for more than {delay} ({what})")
    return None


def check_jobs(lease: Lease) -> dict[str, int]:
    """Open or close each watched job's incident (``decide``) in a fenced write, then send the emails due."""
    watched = {name: job for name, job in jobs().items() if name != SELF}
    rows = SyncLock.objects.filter(job_name__in=watched)
    for name in set(watched) - set(rows.values_list("job_name", flat=True)):
        ensure_lock_row(job=name)  # first seen now: its earlier slots are not judged
    ledgers = job_ledgers(jobs=watched.values())
    health = jobs_health(jobs=watched)
    resumes = dict(
        JobPause.objects.filter(job_name__in=watched, resumed_at__isnull=False)
        .order_by()
        .values("job_name")
        .annotate(last=Max("resumed_at"))
        .values_list("job_name", "last")
    )
    open_incidents = {
        incident.job_name: incident for incident in Incident.objects.open().filter(job_name__in=watched)
    }
    opened = closed = 0
    with fenced(replace(lease)):
        for name, job in watched.items():
            lock, incident, resumed = health[name].lock, open_incidents.get(name), resumes.get(name)
            seen = health[name].first_seen
            action = decide(
                job,
                ledgers[name],
                incident_open=incident is not None,
                paused=lock.paused,
                since=max(seen, resumed or seen),
                last_success=health[name].last_success_at,
                resumed=resumed,
                failover=lock.pause.note if lock.pause.by == FAILOVER_PAUSER else "",
            )
            if action == CLOSE:
                closed += _close(job, incident)
            elif action is not None:
                _open(name, action, lock=lock, ledger=ledgers[name])
                opened += 1
    sent = send_incident_emails(ledgers=ledgers)
    still_open = Incident.objects.open().count()
    return {"jobs": len(watched), "opened": opened, "closed": closed, "open": still_open, "emails": sent}


def _open(name: str, problem: Problem, *, lock: LockState, ledger: Ledger) -> None:
    Incident.objects.create(
        job_name=name,
        reason=problem.reason,
        summary=problem.summary,
        last_error=lock.last_run.error[:2000],
        opened_at=ledger.db_now,
    )
    logger.warning("job=%s incident opened (%s): %s", name, problem.reason, problem.summary)


def _close(job: Job, incident: Incident) -> int:
    closed = Incident.objects.filter(pk=incident.pk, closed_at__isnull=True).update(closed_at=Now())
    logger.warning(
        "job=%s incident closed: %s slots succeeded in a row (opened %s)",
        *(job.name, job.alerts.recoveries, iso(incident.opened_at)),
    )
    return closed


# --- the emails -------------------------------------------------------------------------


def _due(kind: str) -> Q:
    """Not claimed yet, or claimed by a run that died (its claim expired unsettled)."""
    return Q(**{f"{kind}_state": ""}) | Q(**{f"{kind}_state": CLAIMED, f"{kind}_claimed_until__lt": Now()})


def send_incident_emails(*, ledgers: dict[str, Ledger]) -> int:
    """Each opening email due, then each recovery one (after its opening one); raises ``AlertNotSent``."""
    sent = 0
    for incident in Incident.objects.filter(_due("opened_mail")).order_by("opened_at"):
        sent += _send(incident, "opened_mail", *_opening(incident, ledgers.get(incident.job_name)))
    recoveries = Incident.objects.filter(_due("closed_mail"), closed_at__isnull=False)
    for incident in recoveries.exclude(opened_mail_state__in=["", CLAIMED]).order_by("closed_at"):
        sent += _send(incident, "closed_mail", *_recovery(incident, ledgers.get(incident.job_name)))
    return sent


def _send(incident: Incident, kind: str, subject: str, body: str) -> int:
    rows = Incident.objects.filter(pk=incident.pk)
    state, at, claimed_until = f"{kind}_state", f"{kind}_at", f"{kind}_claimed_until"
    recipients = [admin if isinstance(admin, str) else admin[1] for admin in settings.ADMINS]
    if not recipients:
        if rows.filter(_due(kind)).update(**{state: NO_RECIPIENT, at: Now()}):
            logger.warning(
                "job=%s incident email not sent: no recipient (ADMINS is empty): %s",
                incident.job_name,
                subject,
            )
        return 0
    if not rows.filter(_due(kind)).update(**{state: CLAIMED, claimed_until: now_plus(CLAIM_TTL)}):
        return 0  # another run claimed it
    message = EmailMessage(
        f"{settings.EMAIL_SUBJECT_PREFIX}{subject}",
        body,
        settings.SERVER_EMAIL,
        recipients,
        headers={"Auto-Submitted": "auto-generated"},
    )
    outcome, error = hand_over(message)
    mine = rows.filter(**{state: CLAIMED})
    if outcome not in {SENT, UNCERTAIN}:
        mine.update(**{state: "", claimed_until: None})  # the next run sends it
        raise AlertNotSent(f"could not email ADMINS about {incident.job_name}: {error}")
    mine.update(**{state: outcome, at: Now()})
    if outcome == UNCERTAIN:
        raise AlertNotSent(
            f"email to ADMINS about {incident.job_name} is uncertain ({error}): its content went out and "
            "the mail server's answer was lost; it is not sent again by itself"
        )
    logger.info("job=%s incident email sent: %s", incident.job_name, subject)
    return 1


class _Staged:
    """For ``smtplib.SMTP`` and ``SMTP_SSL``: ``content_sent`` says whether the last message's
    content (after DATA's 354) went out: an error after that leaves its fate unknown."""

    content_sent = False
    _awaiting_354 = _content_next = False

    def data(self, msg):
        self._awaiting_354, self.content_sent = True, False
        try:
            return super().data(msg)
        finally:
            self._awaiting_354 = self._content_next = False

    def getreply(self):
        reply = super().getreply()
        if self._awaiting_354:
            self._awaiting_354, self._content_next = False, reply[0] == 354
        return reply

    def send(self, s):
        content, self._content_next = self._content_next, False
        super().send(s)
        if content:
            self.content_sent = True


class _StagedSMTP(_Staged, smtplib.SMTP):
    pass


class _StagedSMTPSSL(_Staged, smtplib.SMTP_SSL):
    pass


class _AlertBackend(smtp.EmailBackend):
    @property
    def connection_class(self):
        return _StagedSMTPSSL if self.use_ssl else _StagedSMTP


def hand_over(message: EmailMessage) -> tuple[str, str]:
    """Send ``message`` on a new connection of the default mailer (``MAILERS`` on Django 6.1 and later,
    else ``EMAIL_BACKEND``): ``(SENT, "")``, ``(UNCERTAIN, error)`` when the content went out without
    an answer, else ``("unsent", error)``."""
    backend = mail.mailers.default if hasattr(mail, "mailers") else mail.get_connection()
    if type(backend) is smtp.EmailBackend:  # Django's SMTP backend: the same, staged (above)
        backend.__class__ = _AlertBackend
    try:
        backend.open()
    except Exception as exc:  # OSError, SMTPException: nothing went out
        return "unsent", error_text(exc)
    connection = getattr(backend, "connection", None)
    try:
        sent = backend.send_messages([message])
    except (smtplib.SMTPResponseException, smtplib.SMTPRecipientsRefused, ValueError) as exc:
        return "unsent", error_text(exc)  # refused by the server: it may be tried again
    except OSError as exc:  # a timeout, a dropped connection
        return (UNCERTAIN if getattr(connection, "content_sent", False) else "unsent"), error_text(exc)
    finally:
        with contextlib.suppress(Exception):
            backend.close()
    return (SENT, "") if sent else ("unsent", "the email backend sent nothing")


def _slots_text(ledger: Ledger | None) -> str:
    if ledger is None:
        return "(no ledger: the job is no longer registered)"
    return "\n".join(f"  {slot.describe()}" for slot in ledger.slots[:EMAIL_SLOTS])


def _opening(incident: Incident, ledger: Ledger | None) -> tuple[str, str]:
    subject = f"job {incident.job_name}: {incident.reason}"
    body = (
        f"Job {incident.job_name} needs attention: {incident.summary}.\n\n"
        f"Incident open since {iso(incident.opened_at)} (database clock).\n"
        f"Last error: {incident.last_error or '(none recorded)'}\n\n"
        f"Its last slots, newest first:\n{_slots_text(ledger)}\n\n"
        "You get one more email when it recovers, and none in between.\n"
    )
    return subject, body


def _recovery(incident: Incident, ledger: Ledger | None) -> tuple[str, str]:
    subject = f"job {incident.job_name}: recovered"
    body = (
        f"Job {incident.job_name} recovered: the incident opened at {iso(incident.opened_at)} "
        f"({incident.reason}: {incident.summary}) closed at {iso(incident.closed_at)}.\n\n"
        f"Its last slots, newest first:\n{_slots_text(ledger)}\n"
    )
    return subject, body
