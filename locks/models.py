from django.db import models
from django.db.models.functions import Now


class RunStatus(models.TextChoices):
    RUNNING = "running", "running"
    SUCCEEDED = "succeeded", "succeeded"
    FAILED = "failed", "failed"
    LOST_LOCK = "lost_lock", "lost lock"
    RELEASED = "released", "force-released"


class SyncLockQuerySet(models.QuerySet):
    def for_job(self, job: str) -> "SyncLockQuerySet":
        return self.filter(job_name=job)

    def free(self) -> "SyncLockQuerySet":
        """Leases nobody holds: never taken, released, or expired (database clock)."""
        return self.filter(models.Q(locked_until__isnull=True) | models.Q(locked_until__lt=Now()))

    def held(self) -> "SyncLockQuerySet":
        return self.filter(locked_until__gte=Now())

    def expired(self) -> "SyncLockQuerySet":
        """Leases whose holder stopped without releasing them."""
        return self.filter(locked_until__lt=Now())


class SyncLock(models.Model):
    """One row per job: the current lease and a summary of the last run.

    Written only through ``locks.api``; every write is a conditional UPDATE.
    """

    job_name = models.CharField("job", max_length=100, unique=True)
    holder = models.CharField(
        max_length=255,
        blank=True,
        default="",
        help_text="host:pid:suffix of the process that took the lease last.",
    )
    token = models.PositiveBigIntegerField(
        "fencing token",
        default=0,
        help_text="Grows by one on every acquisition and force release.",
    )
    acquired_at = models.DateTimeField(null=True, blank=True)
    locked_until = models.DateTimeField(
        null=True,
        blank=True,
        help_text="The lease ends here (database clock). Empty when released.",
    )
    heartbeat_at = models.DateTimeField(
        "last heartbeat", null=True, blank=True, help_text="Last renewal by the holder."
    )
    tick = models.DateTimeField(null=True, blank=True, help_text="The last scheduled slot that was claimed.")
    last_started_at = models.DateTimeField(null=True, blank=True)
    last_finished_at = models.DateTimeField(null=True, blank=True)
    last_status = models.CharField(max_length=20, choices=RunStatus.choices, blank=True)
    last_error = models.TextField(blank=True)

    objects = SyncLockQuerySet.as_manager()

    class Meta:
        verbose_name = "job lock"
        ordering = ["job_name"]
        permissions = [("force_release_synclock", "Can force-release a job lock")]

    def __str__(self) -> str:
        return self.job_name


class JobRunQuerySet(models.QuerySet):
    def for_job(self, job: str) -> "JobRunQuerySet":
        return self.filter(job_name=job)

    def succeeded(self) -> "JobRunQuerySet":
        return self.filter(status=RunStatus.SUCCEEDED)


class JobRun(models.Model):
    """One row per attempt that got the lease."""

    job_name = models.CharField("job", max_length=100)
    tick = models.DateTimeField(null=True, blank=True, help_text="Empty for forced runs.")
    holder = models.CharField(max_length=255)
    token = models.PositiveBigIntegerField("fencing token")
    started_at = models.DateTimeField()
    finished_at = models.DateTimeField(null=True, blank=True)
    status = models.CharField(max_length=20, choices=RunStatus.choices, default=RunStatus.RUNNING)
    stats = models.JSONField(default=dict, blank=True)
    error = models.TextField(blank=True)

    objects = JobRunQuerySet.as_manager()

    class Meta:
        verbose_name = "job run"
        ordering = ["-started_at"]
        indexes = [models.Index(fields=["job_name", "-started_at"], name="jobrun_job_started")]

    def __str__(self) -> str:
        return f"{self.job_name} #{self.token} ({self.status})"

    @property
    def duration(self):
        if self.finished_at is None:
            return None
        return self.finished_at - self.started_at
