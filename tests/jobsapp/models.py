from django.db import models


class SlotWrite(models.Model):
    """One row per committed write of ``tests.jobsapp.jobs.write_slot``: the slot, and the
    lease (token, holder) it was written under. No unique key on purpose: a checker counts
    duplicates instead of the database refusing them."""

    job = models.CharField(max_length=100)
    tick = models.DateTimeField(null=True, blank=True, help_text="Empty for forced runs.")
    token = models.PositiveBigIntegerField()
    holder = models.CharField(max_length=255)
    written_at = models.DateTimeField(auto_now_add=True)

    class Meta:
        indexes = [models.Index(fields=["job", "tick"], name="slotwrite_job_tick")]

    def __str__(self) -> str:
        return f"{self.job} {self.tick} (token {self.token})"
