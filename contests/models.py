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


class ReminderQuerySet(models.QuerySet):
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
