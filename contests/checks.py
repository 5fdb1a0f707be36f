from django.conf import settings
from django.core.checks import Error, Tags, register

from locks.schedule import is_valid_expression


@register(Tags.compatibility)
def check_sync_settings(app_configs=None, **kwargs) -> list[Error]:
    errors = []
    schedule = settings.SYNC_CONTESTS_SCHEDULE
    if not is_valid_expression(schedule):
        errors.append(
            Error(
                f"SYNC_CONTESTS_SCHEDULE {schedule!r} is not a valid cron expression.",
                hint="Five fields: minute hour day-of-month month day-of-week, e.g. '0 * * * *'.",
                id="contests.E001",
            )
        )
    ttl = settings.SYNC_CONTESTS_LOCK_TTL  # an int: settings refuse anything else
    if ttl <= 0:
        errors.append(
            Error(
                f"SYNC_CONTESTS_LOCK_TTL must be a positive number of seconds, got {ttl!r}.",
                id="contests.E002",
            )
        )
    max_run_time = settings.SYNC_CONTESTS_MAX_RUN_TIME
    if max_run_time <= 0:
        errors.append(
            Error(
                f"SYNC_CONTESTS_MAX_RUN_TIME must be a positive number of seconds, got {max_run_time!r}.",
                hint="A sync that runs longer stops renewing its lease; the default is 1800 (30 minutes).",
                id="contests.E003",
            )
        )
    return errors
