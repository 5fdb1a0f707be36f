from django.conf import settings
from django.core.checks import Error, Tags, register

# The jobs' schedules and TTLs reach their LOCKS_JOBS entries, which the locks app checks
# (locks.E011, locks.E013); these are the settings only the reminders read.

MAX_BATCH = 10_000
MAX_CONNECTIONS = 32  # each one also holds a database connection while the run lasts


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
    if not 1 <= settings.SEND_REMINDERS_BATCH <= MAX_BATCH:
        errors.append(
            Error(
                f"SEND_REMINDERS_BATCH must be between 1 and {MAX_BATCH:,}, got {settings.SEND_REMINDERS_BATCH!r}.",
                id="contests.E007",
            )
        )
    if not 1 <= settings.SEND_REMINDERS_CONNECTIONS <= MAX_CONNECTIONS:
        errors.append(
            Error(
                f"SEND_REMINDERS_CONNECTIONS must be between 1 and {MAX_CONNECTIONS}, "
                f"got {settings.SEND_REMINDERS_CONNECTIONS!r}.",
                id="contests.E008",
            )
        )
    return errors
