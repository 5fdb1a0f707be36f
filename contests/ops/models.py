from django.db import models


class Throttle(models.Model):
    """One row per rate-limited key; written only by ``contests.ops.throttle``.

    The key is the primary key, so the first claim is a unique insert and every
    later one a conditional UPDATE: no auto field, the same on every backend.
    """

    key = models.CharField(
        max_length=200, primary_key=True, help_text="What is limited, e.g. sync_contests:203.0.113.7."
    )
    until = models.DateTimeField(
        help_text="The next request for this key is refused before this (database clock)."
    )

    class Meta:
        verbose_name = "rate limit"

    def __str__(self) -> str:
        return self.key
