"""The locks app's system checks: one id per problem, each message a constant here or in
``locks.registry`` (``LOCKS_JOBS``). ``run_job`` runs those tagged ``CHECK_TAG`` (docs/jobs.md, Checks)."""

import importlib.util
from datetime import timedelta

from django.conf import settings
from django.core.checks import Error, Tags, Warning, register
from django.db import DatabaseError, connections, router
from django.utils import timezone
from django.utils.module_loading import import_string

from locks.conf import MAX_LEDGER_SLOTS
from locks.db import error_text, mongodb_transactions, replication_settings
from locks.models import SyncLock
from locks.registry import PATH_KEYS, SLOT_ERRORS, error, job_setting_errors, job_settings
from locks.schedule import DEFAULT_TIMEZONE, Schedule
from locks.tasks import is_task

CHECK_TAG = "locks"
# The schedules' own check runs with `manage.py check` (and every command that runs them all),
# not before each run: at run time a schedule without a slot is its own job's failure only.
SCHEDULE_TAG = "locks_schedules"
MIN_TOKEN_LENGTH = 32
SLOT_HORIZON_YEARS = 5  # a schedule whose next slot lies further ahead is refused (locks.E026)

# Settings that are whole numbers: id, the least value allowed, its unit; a hint by id.
WHOLE_NUMBER = "{name} must be a whole number of {unit}, {least} or more, got {value!r}."
NUMBERS = {
    "LOCKS_DEFAULT_TTL": ("locks.E001", 1, "seconds"),
    "LOCKS_RUN_RETENTION_DAYS": ("locks.E002", 1, "days"),
    "LOCKS_TICK_WINDOW": ("locks.E003", 0, "seconds"),
    "LOCKS_MAX_CLOCK_SKEW": ("locks.E004", 0, "seconds"),
    "LOCKS_SCHEDULER_GRACE": ("locks.E005", 0, "seconds"),
    "LOCKS_TRIGGER_RATE_WINDOW": ("locks.E006", 1, "seconds"),
    "LOCKS_TRUSTED_PROXY_COUNT": ("locks.E007", 0, "proxies"),
    "LOCKS_LEDGER_SLOTS": ("locks.E008", 1, "slots"),
    "LOCKS_SCHEDULER_WORKERS": ("locks.E037", 0, "processes"),
}
NUMBER_HINTS = {
    "locks.E001": "A lease that expires at once would let every copy run.",
    "locks.E002": "How long each job's run history is kept.",
    "locks.E003": "How early a run may claim the upcoming slot; 300 is the default.",
    "locks.E004": "A host clock further off than this gets a warning.",
    "locks.E005": "How long a running job may finish once run_scheduler stops.",
    "locks.E006": "Without it the trigger could start a job again and again.",
    "locks.E007": "The proxies in front of the app that append to X-Forwarded-For.",
    "locks.E008": "How many recent slots the tick ledger shows; 48 is the default.",
    "locks.E037": "run_scheduler's worker processes; 4 is the default, 0 a process per run.",
}
CANNOT_IMPORT = "{where}: {what} {path!r} cannot be imported: {error}."
NOT_CALLABLE = "{where}: {key} {path!r} is not callable."
NOT_AN_EXCEPTION = "{where}: expected error {path!r} is not an exception class."
NOT_A_TASK = "{where}: task {path!r} is not a django.tasks Task (decorate it with @task)."
PATH_ACCEPTS = {"task": (is_task, "locks.E036", NOT_A_TASK)}  # else callable, locks.E022 (_import_errors)
SHORT_TOKEN = "{name} is {length} characters long; use at least {least}."  # noqa: S105
SHORT_TOKEN_HINT = 'Generate one with: python -c "import secrets; print(secrets.token_urlsafe(32))"'  # noqa: S105
NOT_COLLECTORS = "LOCKS_METRICS_COLLECTORS must be a list of dotted paths of functions, got {value!r}."
NO_PROMETHEUS = "LOCKS_METRICS_TOKEN is set, but prometheus_client, which /metrics needs, is not installed."
NO_PROMETHEUS_HINT = "pip install 'django-tick-locks[prometheus]', or leave LOCKS_METRICS_TOKEN empty."
TOO_MANY_SLOTS = "LOCKS_LEDGER_SLOTS must be at most {most}, got {value!r}."
NO_SLOT = "LOCKS_JOBS[{name!r}]: schedule {value!r} has no slot in the next {years} years: {why}."
NO_SLOT_HINT = (
    "The expression is valid cron, but no date matches it (e.g. '0 0 31 2 *' is February 31st); "
    "fix the day of month, month or day of week."
)
SAME_TOKENS = "LOCKS_HEALTHZ_TOKEN is the same as LOCKS_TRIGGER_TOKEN."
NO_SUMMARY_JOB = "LOCKS_HEALTHZ_JOB is {value!r}, which is not a job of LOCKS_JOBS ({names})."
NOT_REPLICATED = (
    "PostgreSQL commits here {how}: a failover can lose acknowledged ticks: exactly once then holds "
    "per database history; see docs/faults.md."
)
NOT_REPLICATED_HINT = (
    "Run a synchronous standby (synchronous_standby_names, synchronous_commit = on or remote_apply), "
    "or accept that a failover may run a slot again (the first run after it warns and marks it)."
)
NO_TRANSACTIONS = (
    "MongoDB is a standalone server here, without transactions: a fenced write renews its lease and "
    "then writes in separate operations, so a holder that loses its lease between them still writes."
)
NO_TRANSACTIONS_HINT = (
    "Run MongoDB as a replica set (one member is enough): the renewal and the write then commit in "
    "one transaction; see docs/mongodb.md."
)
SAME_TOKENS_HINT = "Give monitors a token of their own: the trigger token can start forced runs."


@register(CHECK_TAG)
def check_lock_settings(app_configs=None, **kwargs) -> list[Error]:
    errors = []
    for name, (code, least, unit) in NUMBERS.items():
        value = getattr(settings, name)
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            message = WHOLE_NUMBER.format(name=name, unit=unit, least=least, value=value)
            errors.append(Error(message, hint=NUMBER_HINTS[code], id=code))
    slots = settings.LOCKS_LEDGER_SLOTS
    if isinstance(slots, int) and slots > MAX_LEDGER_SLOTS:
        message = TOO_MANY_SLOTS.format(most=MAX_LEDGER_SLOTS, value=slots)
        errors.append(Error(message, hint=NUMBER_HINTS["locks.E008"], id="locks.E008"))
    return errors


@register(SCHEDULE_TAG)
def check_schedules(app_configs=None, **kwargs) -> list[Error]:
    """Each job's schedule has a slot within ``SLOT_HORIZON_YEARS``; ``LOCKS_HEALTHZ_JOB`` names a job."""
    entries = job_settings()
    if job_setting_errors(entries):
        return []  # check_jobs_setting reports them; a schedule is judged once it is well formed
    now, errors, summary = timezone.now(), [], settings.LOCKS_HEALTHZ_JOB
    if summary and summary not in entries:  # /healthz would repeat no job's fields, but name it when down
        errors.append(
            Warning(NO_SUMMARY_JOB.format(value=summary, names=", ".join(entries)), id="locks.W008")
        )
    for name, entry in entries.items():
        try:
            upcoming = Schedule(entry["schedule"], entry.get("timezone", DEFAULT_TIMEZONE)).next_slot(now)
            far = upcoming - now > timedelta(days=365 * SLOT_HORIZON_YEARS + 1)
            why = f"its next slot is {upcoming.isoformat()}" if far else ""
        except SLOT_ERRORS as exc:
            why = f"no slot can be computed after {now:%Y-%m-%d} ({type(exc).__name__}: {exc})"
        if why:
            message = NO_SLOT.format(name=name, value=entry["schedule"], years=SLOT_HORIZON_YEARS, why=why)
            errors.append(Error(message, hint=NO_SLOT_HINT, id="locks.E026"))
    return errors


@register(CHECK_TAG)
def check_metrics_collectors(app_configs=None, **kwargs) -> list[Error]:
    """Each of ``LOCKS_METRICS_COLLECTORS`` a function; prometheus_client installed if /metrics is on."""
    paths = settings.LOCKS_METRICS_COLLECTORS
    if not isinstance(paths, list | tuple) or not all(isinstance(path, str) and path for path in paths):
        return [Error(NOT_COLLECTORS.format(value=paths), id="locks.E009")]
    errors = []
    if settings.LOCKS_METRICS_TOKEN and importlib.util.find_spec("prometheus_client") is None:
        errors.append(Error(NO_PROMETHEUS, hint=NO_PROMETHEUS_HINT, id="locks.E034"))
    for path in paths:
        errors += _import_errors("LOCKS_METRICS_COLLECTORS", "collector", path)
    return errors


@register(CHECK_TAG)
def check_jobs_setting(app_configs=None, **kwargs) -> list[Error]:
    """``LOCKS_JOBS`` (``locks.registry``), and each dotted path it names imported."""
    entries = job_settings()  # the app's own check_jobs too
    errors = job_setting_errors(entries)
    if errors:
        return errors  # a path is imported only once the entries are well formed
    for name, entry in entries.items():
        where = f"LOCKS_JOBS[{name!r}]"
        for key in PATH_KEYS:
            if entry.get(key) is not None:
                errors += _import_errors(where, key, entry[key], *PATH_ACCEPTS.get(key, ()))
        for path in entry.get("expected_errors", ()):
            errors.extend(
                _import_errors(where, "expected error", path, _is_exception, "locks.E023", NOT_AN_EXCEPTION)
            )
    return errors


def _import_errors(
    where: str, what: str, path: str, accept=callable, code: str = "locks.E022", refusal: str = NOT_CALLABLE
) -> list[Error]:
    """``path`` imported: E021 if it cannot be, ``code`` if what it names is not ``accept``ed."""
    try:
        target = import_string(path)
    except Exception as exc:  # ImportError, or whatever importing the module raised
        return [error("locks.E021", CANNOT_IMPORT, where=where, what=what, path=path, error=error_text(exc))]
    return [] if accept(target) else [error(code, refusal, where=where, key=what, path=path)]


def _is_exception(target) -> bool:
    return isinstance(target, type) and issubclass(target, BaseException)


@register(Tags.security, deploy=True)
def check_tokens(app_configs=None, **kwargs) -> list[Warning]:
    warnings = []
    for name, code in (
        ("LOCKS_TRIGGER_TOKEN", "locks.W001"),
        ("LOCKS_HEALTHZ_TOKEN", "locks.W002"),
        ("LOCKS_METRICS_TOKEN", "locks.W004"),
    ):
        token = getattr(settings, name)
        if token and len(token) < MIN_TOKEN_LENGTH:
            message = SHORT_TOKEN.format(name=name, length=len(token), least=MIN_TOKEN_LENGTH)
            warnings.append(Warning(message, hint=SHORT_TOKEN_HINT, id=code))
    if settings.LOCKS_TRIGGER_TOKEN and settings.LOCKS_TRIGGER_TOKEN == settings.LOCKS_HEALTHZ_TOKEN:
        warnings.append(Warning(SAME_TOKENS, hint=SAME_TOKENS_HINT, id="locks.W003"))
    return warnings


@register(Tags.database, deploy=True)
def check_replication(app_configs=None, databases=None, **kwargs) -> list[Warning]:
    """On PostgreSQL, whether an acknowledged commit survives a failover: only with a synchronous
    standby (docs/faults.md, "Failover"); ``check --deploy --database default`` asks the server."""
    using = router.db_for_write(SyncLock)
    if databases is None or using not in databases or connections[using].vendor != "postgresql":
        return []
    found = replication_settings(using=using)
    if found is None:
        return []
    if found["synchronous_commit"] in {"off", "local"}:
        how = f"with synchronous_commit = {found['synchronous_commit']}"
    elif not found["synchronous_standby_names"].strip():
        how = "without a synchronous standby (synchronous_standby_names is empty)"
    else:
        return []
    return [Warning(NOT_REPLICATED.format(how=how), hint=NOT_REPLICATED_HINT, id="locks.W006")]


@register(Tags.database, deploy=True)
def check_mongodb_transactions(app_configs=None, databases=None, **kwargs) -> list[Warning]:
    """On MongoDB, whether a fenced write is one transaction (a replica set) or check-then-write
    (a standalone server). A database check: ``check --deploy --database default`` asks the server."""
    using = router.db_for_write(SyncLock)
    if databases is None or using not in databases:
        return []
    try:
        has = mongodb_transactions(using=using)
    except DatabaseError:  # unreachable: other checks and the first tick say so
        return []
    return [Warning(NO_TRANSACTIONS, hint=NO_TRANSACTIONS_HINT, id="locks.W007")] if has is False else []
