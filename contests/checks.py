"""The reminders' settings (docs/reminders.md); the jobs' schedules and TTLs reach their
LOCKS_JOBS entries, which the locks app checks. Tagged ``contests`` and ``locks``: ``run_job``
runs the checks tagged ``locks`` before every run."""

from django.conf import settings
from django.core.checks import Error, register

from locks.checks import TAG

CLAIM_TTL_TOO_SHORT = (
    "SEND_REMINDERS_CLAIM_TTL ({claim_ttl!r} s) must be more than three times EMAIL_TIMEOUT "
    "({timeout!r} s): a claim that expires while its email is still being sent lets another "
    "run send it again."
)
TOO_FEW_ATTEMPTS = "SEND_REMINDERS_MAX_ATTEMPTS must be 1 or more, got {attempts!r}."


@register("contests", TAG)
def check_reminder_settings(app_configs=None, **kwargs) -> list[Error]:
    errors = []
    claim_ttl, timeout = settings.SEND_REMINDERS_CLAIM_TTL, settings.EMAIL_TIMEOUT
    if timeout is None or claim_ttl <= 3 * timeout:
        errors.append(
            Error(CLAIM_TTL_TOO_SHORT.format(claim_ttl=claim_ttl, timeout=timeout), id="contests.E005")
        )
    if settings.SEND_REMINDERS_MAX_ATTEMPTS < 1:
        message = TOO_FEW_ATTEMPTS.format(attempts=settings.SEND_REMINDERS_MAX_ATTEMPTS)
        errors.append(Error(message, id="contests.E006"))
    return errors
