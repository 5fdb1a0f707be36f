from django.conf import settings
from django.core.checks import Error, Tags, register

from locks.schedule import is_valid_expression


@register(Tags.compatibility)
def check_sync_settings(app_configs=None, **kwargs) -> list[Error]:
    errors = []
    schedule = getattr(settings, "SYNC_CONTESTS_SCHEDULE", None)
    if not is_valid_expression(schedule):
        errors.append(
            Error(
                f"SYNC_CONTESTS_SCHEDULE {schedule!r} is not a valid cron expression.",
                hint="Five fields: minute hour day-of-month month day-of-week, e.g. '0 * * * *'.",
                id="contests.E001",
            )
        )
    ttl = getattr(settings, "SYNC_CONTESTS_LOCK_TTL", None)
    if not isinstance(ttl, (int, float)) or isinstance(ttl, bool) or ttl <= 0:
        errors.append(
            Error(
                f"SYNC_CONTESTS_LOCK_TTL must be a positive number of seconds, got {ttl!r}.",
                id="contests.E002",
            )
        )
    return errors
