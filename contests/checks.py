"""The reminders' settings (docs/reminders.md) and what every reminder carries; the jobs'
schedules and TTLs reach their LOCKS_JOBS entries, which the locks app checks. Tagged
``contests`` and ``locks``: ``run_job`` runs the checks tagged ``locks`` before every run. With
``check --deploy``, the project's email and Codeforces transports (docs/security.md)."""

import re
from urllib.parse import urlsplit

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.core.exceptions import ValidationError
from django.core.validators import validate_email

from locks import CHECK_TAG

SMTP_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
W001 = (
    "EMAIL_URL sends a user name and password to the SMTP server without TLS: anyone on the "
    "path can read the password."
)
W001_HINT = "Use smtp+tls://user:password@host:587 (STARTTLS) or smtp+ssl://user:password@host:465."
W002 = (
    "CODEFORCES_API_URL is plain http://: anyone on the path can change the contest list the "
    "sync stores (and read any credentials in the URL)."
)
W002_HINT = "Use https://, as the default https://codeforces.com/api does."

CLAIM_TTL_TOO_SHORT = (
    "SEND_REMINDERS_CLAIM_TTL ({claim_ttl!r} s) must be more than three times EMAIL_TIMEOUT "
    "({timeout!r} s): a claim that expires while its email is still being sent lets another "
    "run send it again."
)
TOO_FEW_ATTEMPTS = "SEND_REMINDERS_MAX_ATTEMPTS must be 1 or more, got {attempts!r}."
BATCH_OUT_OF_RANGE = "SEND_REMINDERS_BATCH must be between 1 and {most:,}, got {batch!r}."
CONNECTIONS_OUT_OF_RANGE = "SEND_REMINDERS_CONNECTIONS must be between 1 and {most}, got {connections!r}."

BAD_MESSAGE_ID_DOMAIN = (
    "SEND_REMINDERS_MESSAGE_ID_DOMAIN must be a domain name (letters, digits, hyphens, dots), got {domain!r}: "
    "it ends each reminder's Message-ID."
)
SITE_URL_NOT_HTTPS = (
    "SITE_URL must be this site's https:// address when DEBUG is off, {got}: each reminder's one-click "
    "unsubscribe link (RFC 8058) points there, and mailbox providers take only https:// ones."
)
SITE_URL_HINT = "Set SITE_URL to where users reach this site, e.g. https://contests.example.com."
SITE_URL_MALFORMED = "SITE_URL must be an http:// or https:// address with a host, got {url!r}."
BAD_UNSUBSCRIBE_MAILTO = "SEND_REMINDERS_UNSUBSCRIBE_MAILTO must be an email address, got {address!r}."

SEND_REMINDERS = "contests.jobs.send_reminders"  # the callable of the job that sends them

# A host name: labels of letters, digits and inner hyphens, joined by dots.
DOMAIN = re.compile(
    r"(?=.{1,253}\Z)[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?)*\Z"
)
MAX_BATCH = 10_000
MAX_CONNECTIONS = 32  # each one a thread and an SMTP session while the run lasts


@register("contests", CHECK_TAG)
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
    if not 1 <= settings.SEND_REMINDERS_BATCH <= MAX_BATCH:
        message = BATCH_OUT_OF_RANGE.format(most=MAX_BATCH, batch=settings.SEND_REMINDERS_BATCH)
        errors.append(Error(message, id="contests.E007"))
    if not 1 <= settings.SEND_REMINDERS_CONNECTIONS <= MAX_CONNECTIONS:
        message = CONNECTIONS_OUT_OF_RANGE.format(
            most=MAX_CONNECTIONS, connections=settings.SEND_REMINDERS_CONNECTIONS
        )
        errors.append(Error(message, id="contests.E008"))
    return errors


@register("contests")
def check_reminder_headers(app_configs=None, **kwargs) -> list[Error]:
    """What every reminder carries: its Message-ID's domain, its unsubscribe links. Not tagged
    ``locks``: a wrong one stops only ``send_reminders`` (``contests.jobs``), never another job's
    run; ``manage.py check`` reports it."""
    errors = []
    domain = settings.SEND_REMINDERS_MESSAGE_ID_DOMAIN
    if domain and not DOMAIN.match(domain):
        errors.append(Error(BAD_MESSAGE_ID_DOMAIN.format(domain=domain), id="contests.E009"))
    sent = any(job.get("callable") == SEND_REMINDERS for job in settings.LOCKS_JOBS.values())
    url = settings.SITE_URL
    try:
        parts = urlsplit(url)
        host = parts.hostname
    except ValueError:  # an unclosed [ of an IPv6 address
        parts, host = urlsplit(""), None
    if url and (parts.scheme not in {"http", "https"} or not host):
        errors.append(Error(SITE_URL_MALFORMED.format(url=url), hint=SITE_URL_HINT, id="contests.E010"))
    elif sent and not settings.DEBUG and parts.scheme != "https":
        got = f"got {url!r}" if url else "and it is not set"
        errors.append(Error(SITE_URL_NOT_HTTPS.format(got=got), hint=SITE_URL_HINT, id="contests.E010"))
    address = settings.SEND_REMINDERS_UNSUBSCRIBE_MAILTO
    if address:
        try:
            validate_email(address)
        except ValidationError:
            errors.append(Error(BAD_UNSUBSCRIBE_MAILTO.format(address=address), id="contests.E011"))
    return errors


@register(Tags.security, deploy=True)
def check_email_transport(app_configs=None, **kwargs) -> list[Warning]:
    plain = not (settings.EMAIL_USE_TLS or settings.EMAIL_USE_SSL)
    credentials = settings.EMAIL_HOST_USER or settings.EMAIL_HOST_PASSWORD
    if settings.EMAIL_BACKEND == SMTP_BACKEND and credentials and plain:
        return [Warning(W001, hint=W001_HINT, id="contests.W001")]
    return []


@register(Tags.security, deploy=True)
def check_codeforces_transport(app_configs=None, **kwargs) -> list[Warning]:
    if urlsplit(settings.CODEFORCES_API_URL).scheme.lower() == "http":
        return [Warning(W002, hint=W002_HINT, id="contests.W002")]
    return []
