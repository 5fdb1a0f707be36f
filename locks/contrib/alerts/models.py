from django.db import models


class IncidentQuerySet(models.QuerySet):
    def open(self) -> "IncidentQuerySet":
        return self.filter(closed_at__isnull=True)


# An alert email's state ("": not claimed yet).
MAIL_STATES = [
    ("", "pending"),
    ("claimed", "claimed (being sent)"),
    ("sent", "sent"),
    ("uncertain", "uncertain (the mail server's answer was lost)"),
    ("no recipient", "no recipient (ADMINS is empty)"),
]


def mail_settled_at(email: str) -> models.DateTimeField:
    help_text = f"When the {email} email was sent, became uncertain or found no recipient."
    return models.DateTimeField(f"{email} email settled", null=True, blank=True, help_text=help_text)


def mail_state(email: str) -> models.CharField:
    return models.CharField(
        f"{email} email", max_length=20, blank=True, default="", db_default="", choices=MAIL_STATES
    )


class Incident(models.Model):
    """A job that needs a human, from the time ``check_jobs`` saw it until it recovered:
    one opening email, one recovery email (``jobs.py``). Read-only in the admin."""

    job_name = models.CharField("job", max_length=100)
    reason = models.CharField(
        max_length=20, help_text="missed, failed, stale, error or failover: what opened it."
    )
    summary = models.TextField(help_text="What check_jobs saw when it opened the incident.")
    last_error = models.TextField("last error", blank=True, default="")
    opened_at = models.DateTimeField("opened at")
    closed_at = models.DateTimeField("closed at", null=True, blank=True, help_text="Empty: still open.")
    opened_mail_at = mail_settled_at("opening")
    closed_mail_at = mail_settled_at("recovery")
    # Each email is claimed, then sent or uncertain (jobs.py): a claim that expires unsettled
    # (its sender died) is claimed again; an uncertain one is never sent again by itself.
    opened_mail_state = mail_state("opening")
    opened_mail_claimed_until = models.DateTimeField("opening email claimed until", null=True, blank=True)
    closed_mail_state = mail_state("recovery")
    closed_mail_claimed_until = models.DateTimeField("recovery email claimed until", null=True, blank=True)

    objects = IncidentQuerySet.as_manager()

    class Meta:
        db_table = "locks_incident"  # the table locks created (its 0006, 0008): moving here moved no row
        verbose_name = "incident"
        ordering = ["-opened_at"]
        indexes = [models.Index(fields=["job_name", "-opened_at"], name="incident_job_opened")]

    def __str__(self) -> str:
        return f"{self.job_name}: {self.reason} since {self.opened_at:%Y-%m-%d %H:%M}"

    @property
    def opening_email(self) -> str:
        return self.opened_mail_state or "pending"
