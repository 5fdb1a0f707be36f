from django.conf import settings
from django.core.checks import Error, Tags, register

# The jobs' schedules and TTLs reach their LOCKS_JOBS entries, which the locks app checks
# (locks.E011, locks.E013); these are the settings only the reminders read.


@register(Tags.compatibility)
def check_reminder_settings(app_configs=None, **kwargs) -> list[Error]:
    errors = []
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
