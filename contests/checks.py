from django.conf import settings
from django.core.checks import Error, Tags, register

from locks.schedule import is_valid_expression


def _schedule_error(name: str, code: str) -> list[Error]:
    schedule = getattr(settings, name)
    if is_valid_expression(schedule):
        return []
    return [
        Error(
            f"{name} {schedule!r} is not a valid cron expression.",
            hint="Five fields: minute hour day-of-month month day-of-week, e.g. '0 * * * *'.",
            id=code,
        )
    ]


def _positive_error(name: str, code: str) -> list[Error]:
    value = getattr(settings, name)  # an int: settings refuse anything else
    if value > 0:
        return []
    return [Error(f"{name} must be a positive number of seconds, got {value!r}.", id=code)]


@register(Tags.compatibility)
def check_sync_settings(app_configs=None, **kwargs) -> list[Error]:
    return [
        *_schedule_error("SYNC_CONTESTS_SCHEDULE", "contests.E001"),
        *_positive_error("SYNC_CONTESTS_LOCK_TTL", "contests.E002"),
    ]


@register(Tags.compatibility)
def check_reminder_settings(app_configs=None, **kwargs) -> list[Error]:
    errors = [
        *_schedule_error("SEND_REMINDERS_SCHEDULE", "contests.E003"),
        *_positive_error("SEND_REMINDERS_LOCK_TTL", "contests.E004"),
    ]
    claim_ttl, timeout = settings.SEND_REMINDERS_CLAIM_TTL, settings.EMAIL_TIMEOUT
    if timeout is None or claim_ttl <= 3 * timeout:
        errors.append(
            Error(
                f"SEND_REMINDERS_CLAIM_TTL ({claim_ttl!r} s) must be more than three times EMAIL_TIMEOUT "
                f"({timeout!r} s): a claim that expires while its email is still being sent lets another "
                "run send it again.",
                id="contests.E005",
            )
        )
    if settings.SEND_REMINDERS_MAX_ATTEMPTS < 1:
        errors.append(
            Error(
                f"SEND_REMINDERS_MAX_ATTEMPTS must be 1 or more, got {settings.SEND_REMINDERS_MAX_ATTEMPTS!r}.",
                id="contests.E006",
            )
        )
    return errors
