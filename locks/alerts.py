"""``check_jobs``: the job that watches every other registered job and emails ``ADMINS`` once
when an incident opens and once when it is over (docs/architecture.md, "Alerts").

It runs under its own lease like every job, so however many replicas run it, one run at a
time judges the ledger (``locks.status``) and writes the incidents, inside its fenced write.
Each email is claimed on its incident row first (a conditional UPDATE), then sent: at most
one opening and one recovery email per incident; one that could not be sent is unclaimed and
sent by the next run.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.core.mail import mail_admins
from django.db.models import Max
from django.db.models.functions import Now

from locks.db import error_text
from locks.lease import Lease, fenced, iso
from locks.models import Incident, JobPause, SyncLock
from locks.operator import ensure_lock_row
from locks.registry import Job, jobs
from locks.status import MISSED, Ledger, job_ledgers, jobs_health

logger = logging.getLogger(__name__)

SELF = "check_jobs"
# Slots of the ledger an email shows, newest first.
EMAIL_SLOTS = 12


class AlertNotSent(RuntimeError):
    """An email could not be handed to the mail server; the next run sends it."""


@dataclass(frozen=True)
class Problem:
    reason: str  # missed, failed or stale
    summary: str


def job_problem(
    job: Job, ledger: Ledger, *, since: datetime, last_success: datetime | None
) -> Problem | None:
    """What is wrong with ``job``, if anything (issue 19): its latest settled slot missed,
    ``alert_after_failures`` failed slots in a row, or no success for ``alert_after``. Only slots
    at or after ``since`` count (when the job was first seen, or last resumed: a deployment
    does not alert for the slots before it, nor a resume for the pause)."""
    settled = ledger.settled(since=since)
    if settled and settled[0].outcome == MISSED:
        return Problem("missed", f"its slot {settled[0].describe()}: no run succeeded and its chance is over")
    streak = ledger.failed_in_a_row(since=since)
    if streak and len(streak) >= job.alert_after_failures:
        return Problem("failed", f"{len(streak)} slots failed in a row, since {streak[-1].describe()}")
    delay = job.alert_delay(now=ledger.db_now)
    start = max(since, last_success) if last_success is not None else since
    if ledger.db_now - start > delay:
        what = f"its last success was at {iso(last_success)}" if last_success else "it never succeeded"
        return Problem("stale", f"no success for more than {delay} ({what})")
    return None


def check_jobs(lease: Lease) -> dict[str, int]:
    """Open an incident for each registered job that has a problem and none open (never for a
    paused job), close the open incidents of jobs without one; then send the emails due."""
    watched = {name: job for name, job in jobs().items() if name != SELF}
    for name in set(watched) - set(
        SyncLock.objects.filter(job_name__in=watched).values_list("job_name", flat=True)
    ):
        ensure_lock_row(job=name)  # first seen now: its earlier slots are not judged
    ledgers = job_ledgers(jobs=watched.values())
    locks = {
        row["job_name"]: row
        for row in SyncLock.objects.filter(job_name__in=watched).values(
            "job_name", "paused_at", "last_error", "created_at"
        )
    }
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
    with fenced(lease):
        for name, job in watched.items():
            lock = locks[name]
            since = max(lock["created_at"], resumes.get(name, lock["created_at"]))
            problem = job_problem(job, ledgers[name], since=since, last_success=health[name].last_success_at)
            incident = open_incidents.get(name)
            if incident is None and problem is not None and lock["paused_at"] is None:
                Incident.objects.create(
                    job_name=name,
                    reason=problem.reason,
                    summary=problem.summary,
                    last_error=lock["last_error"][:2000],
                    opened_at=ledgers[name].db_now,
                )
                opened += 1
                logger.warning("job=%s incident opened (%s): %s", name, problem.reason, problem.summary)
            elif incident is not None and problem is None:
                closed += Incident.objects.filter(pk=incident.pk, closed_at__isnull=True).update(
                    closed_at=Now()
                )
                logger.warning(
                    "job=%s incident closed: it recovered (opened %s)", name, iso(incident.opened_at)
                )
    sent = send_incident_emails(ledgers=ledgers)
    still_open = Incident.objects.open().count()
    return {"jobs": len(watched), "opened": opened, "closed": closed, "open": still_open, "emails": sent}


def send_incident_emails(*, ledgers: dict[str, Ledger]) -> int:
    """Each opening email not sent yet, then each recovery email; every one claimed on its
    row before it is sent, so no two runs send the same. Raises ``AlertNotSent`` (after
    unclaiming it) for the first that the mail server refused."""
    sent = 0
    for incident in Incident.objects.filter(opened_mail_at__isnull=True).order_by("opened_at"):
        sent += _send(incident, "opened_mail_at", *_opening(incident, ledgers.get(incident.job_name)))
    for incident in Incident.objects.filter(closed_at__isnull=False, closed_mail_at__isnull=True).order_by(
        "closed_at"
    ):
        if incident.opened_mail_at is None:
            continue  # its opening email has not gone out: the next run sends both in order
        sent += _send(incident, "closed_mail_at", *_recovery(incident, ledgers.get(incident.job_name)))
    return sent


def _send(incident: Incident, field: str, subject: str, body: str) -> int:
    claim = Incident.objects.filter(pk=incident.pk, **{f"{field}__isnull": True})
    if not claim.update(**{field: Now()}):
        return 0  # another run claimed it
    try:
        mail_admins(subject, body, fail_silently=False)
    except Exception as exc:  # SMTPException, OSError: whatever the backend raised
        Incident.objects.filter(pk=incident.pk).update(**{field: None})
        raise AlertNotSent(f"could not email ADMINS about {incident.job_name}: {error_text(exc)}") from exc
    logger.info("job=%s incident email sent: %s", incident.job_name, subject)
    return 1


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
