from django.conf import settings
from django.db import models
from django.db.models import Q
from django.db.models.functions import Now


class Platform(models.TextChoices):
    CODEFORCES = "codeforces", "Codeforces"


class ContestQuerySet(models.QuerySet):
    def upcoming(self, *, now=None) -> "ContestQuerySet":
        """Not started yet and still announced."""
        return self.filter(start_time__gt=now or Now(), removed_at__isnull=True)

    def removed(self) -> "ContestQuerySet":
        return self.filter(removed_at__isnull=False)


class Contest(models.Model):
    platform = models.CharField(max_length=20, choices=Platform.choices, default=Platform.CODEFORCES)
    contest_id = models.PositiveIntegerField("contest id", help_text="The platform's own id.")
    name = models.CharField(max_length=500)
    type = models.CharField(max_length=20, help_text="CF, IOI, ICPC, …")
    phase = models.CharField(max_length=40, help_text="BEFORE, CODING, FINISHED, …")
    frozen = models.BooleanField(default=False)
    start_time = models.DateTimeField(null=True, blank=True)
    duration = models.DurationField()
    fingerprint = models.CharField(
        max_length=32, editable=False, help_text="Hash of the synced content; a change means an update."
    )
    first_seen_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(help_text="Last time the synced content changed.")
    removed_at = models.DateTimeField(
        null=True, blank=True, help_text="An upcoming contest that vanished from the API."
    )

    objects = ContestQuerySet.as_manager()

    class Meta:
        ordering = ["-start_time"]
        constraints = [
            models.UniqueConstraint(fields=["platform", "contest_id"], name="contest_platform_id_unique")
        ]

    def __str__(self) -> str:
        return self.name

    @property
    def url(self) -> str:
        return f"https://codeforces.com/contest/{self.contest_id}"


# A reminder a run may still send: neither delivered, nor given up, nor uncertain.
OUTSTANDING = Q(delivered_at__isnull=True, failed_at__isnull=True, uncertain_at__isnull=True)


class ReminderQuerySet(models.QuerySet):
    def due(self, *, now=None) -> "ReminderQuerySet":
        """Reminders to send now: their time has come, their contest has not started
        and was not removed, and they were neither delivered, nor given up, nor left
        uncertain. (Claimed ones are due too: ``claimable()`` tells which a run may take.)"""
        now = now or Now()
        return self.filter(
            remind_at__lte=now,
            contest__start_time__gt=now,
            contest__removed_at__isnull=True,
        ).outstanding()

    def outstanding(self) -> "ReminderQuerySet":
        """Neither delivered, nor given up, nor uncertain: a run may still send it."""
        return self.filter(OUTSTANDING)

    def claimable(self) -> "ReminderQuerySet":
        """Outstanding, and not claimed by a run right now (by the database clock). Only the
        reminder's own fields: a claim's UPDATE re-checks it on every row it changes."""
        return self.filter(Q(claimed_until__isnull=True) | Q(claimed_until__lt=Now())).outstanding()

    def stale(self, *, now=None) -> "ReminderQuerySet":
        """Reminders that can no longer fire: the contest started, finished or was removed."""
        return self.filter(
            Q(contest__start_time__lte=now or Now())
            | Q(contest__phase="FINISHED")
            | Q(contest__removed_at__isnull=False)
        )


class Reminder(models.Model):
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="reminders")
    contest = models.ForeignKey(Contest, on_delete=models.CASCADE, related_name="reminders")
    remind_at = models.DateTimeField()
    created_at = models.DateTimeField(auto_now_add=True)
    # Delivery, written by the send_reminders job only (docs/reminders.md).
    delivered_at = models.DateTimeField(
        "delivered at",
        null=True,
        blank=True,
        help_text="When its email was handed to the mail server (database clock); it is never sent again.",
    )
    attempts = models.PositiveIntegerField(
        default=0,
        help_text="Tries to hand its email to the mail server so far (a claim released unsent costs none).",
    )
    last_error = models.TextField(
        "last error",
        blank=True,
        default="",
        help_text="Why the last try did not deliver it; kept after a success.",
    )
    claimed_until = models.DateTimeField(
        "claimed until",
        null=True,
        blank=True,
        help_text="A run is sending it until then (database clock); afterwards a later run may claim it again.",
    )
    claimed_by = models.CharField(
        "claimed by",
        max_length=200,
        blank=True,
        default="",
        db_index=True,
        help_text="The run and batch (host:pid:suffix/run.batch) that claimed it last.",
    )
    failed_at = models.DateTimeField(
        "failed at",
        null=True,
        blank=True,
        help_text="When it was given up without a message: every attempt failed, or the user has no email "
        "address (the last error says which). The admin's retry action clears it.",
    )
    uncertain_at = models.DateTimeField(
        "uncertain since",
        null=True,
        blank=True,
        help_text="When its email's fate became unknown: the message went out but the mail server's answer "
        "never came (a timeout, a dropped connection). It may have been delivered, so it is never sent again "
        "by itself; the admin's retry action sends it again.",
    )

    objects = ReminderQuerySet.as_manager()

    class Meta:
        ordering = ["remind_at"]
        constraints = [
            models.UniqueConstraint(
                fields=["user", "contest", "remind_at"], name="reminder_user_contest_time_unique"
            )
        ]

    def __str__(self) -> str:
        return f"{self.user} · {self.contest} at {self.remind_at:%Y-%m-%d %H:%M}"
