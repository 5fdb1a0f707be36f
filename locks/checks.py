from django.conf import settings
from django.core.checks import Error, Tags, register


@register(Tags.compatibility)
def check_lock_settings(app_configs=None, **kwargs) -> list[Error]:
    # The settings module reads these as integers; only the sign is left to check.
    errors = []
    ttl = getattr(settings, "LOCKS_DEFAULT_TTL", 300)
    if ttl <= 0:
        errors.append(
            Error(
                f"LOCKS_DEFAULT_TTL must be a positive number of seconds, got {ttl!r}.",
                hint="A lease that expires at once would let every copy of a job run.",
                id="locks.E001",
            )
        )
    retention = getattr(settings, "LOCKS_RUN_RETENTION_DAYS", 30)
    if retention <= 0:
        errors.append(
            Error(
                f"LOCKS_RUN_RETENTION_DAYS must be a positive whole number, got {retention!r}.",
                id="locks.E002",
            )
        )
    window = getattr(settings, "LOCKS_TICK_WINDOW", 300)
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        errors.append(
            Error(
                f"LOCKS_TICK_WINDOW must be a whole number of seconds, 0 or more, got {window!r}.",
                hint="How early a run may claim the upcoming slot; 300 (5 minutes) is the default.",
                id="locks.E003",
            )
        )
    return errors
