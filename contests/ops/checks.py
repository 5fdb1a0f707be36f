from django.conf import settings
from django.core.checks import Error, Tags, Warning, register

MIN_TOKEN_LENGTH = 32


@register(Tags.compatibility)
def check_ops_settings(app_configs=None, **kwargs) -> list[Error]:
    errors = []
    # Both are ints: settings refuse anything else.
    window = settings.SYNC_TRIGGER_RATE_WINDOW
    if window <= 0:
        errors.append(
            Error(
                f"SYNC_TRIGGER_RATE_WINDOW must be a positive whole number of seconds, got {window!r}.",
                hint="Without it the trigger endpoint could be used to hammer the Codeforces API.",
                id="ops.E001",
            )
        )
    proxies = settings.TRUSTED_PROXY_COUNT
    if proxies < 0:
        errors.append(
            Error(
                f"TRUSTED_PROXY_COUNT must be a whole number, 0 or more, got {proxies!r}.",
                hint="The number of proxies in front of the app that append to X-Forwarded-For.",
                id="ops.E002",
            )
        )
    return errors


@register(Tags.security, deploy=True)
def check_trigger_token(app_configs=None, **kwargs) -> list[Warning]:
    warnings = []
    for name, code in (("SYNC_TRIGGER_TOKEN", "ops.W001"), ("HEALTHZ_TOKEN", "ops.W002")):
        token = getattr(settings, name)
        if token and len(token) < MIN_TOKEN_LENGTH:
            warnings.append(
                Warning(
                    f"{name} is {len(token)} characters long; use at least {MIN_TOKEN_LENGTH}.",
                    hint='Generate one with: python -c "import secrets; print(secrets.token_urlsafe(32))"',
                    id=code,
                )
            )
    trigger = settings.SYNC_TRIGGER_TOKEN
    if trigger and trigger == settings.HEALTHZ_TOKEN:
        warnings.append(
            Warning(
                "HEALTHZ_TOKEN is the same as SYNC_TRIGGER_TOKEN.",
                hint="Give monitors a token of their own: the trigger token can start forced syncs.",
                id="ops.W003",
            )
        )
    return warnings
