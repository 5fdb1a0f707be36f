"""The jobs a project registers in ``LOCKS_JOBS`` (and the app's own, ``check_jobs``): validating the setting, reading it into ``Job``s. The one list of jobs: cron, the scheduler, the admin, ``locks status``, ``/healthz`` and the trigger read it (docs/jobs.md). Dotted paths are imported only when a job runs, and nothing here touches settings at import: the settings module reads the built-in jobs through ``locks.crontab``."""

from __future__ import annotations

import math
import re
from collections import namedtuple
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from functools import cache

from croniter import CroniterBadDateError
from django.apps import apps
from django.conf import settings
from django.core.checks import Error
from django.core.exceptions import ImproperlyConfigured
from django.core.signals import setting_changed
from django.dispatch import receiver
from django.utils import timezone
from django.utils.module_loading import import_string

from locks import schedule

# What the slot arithmetic raises for an expression croniter can find no slot of (``0 0 31 2 *``)
# or one beyond what a datetime holds: that job's failure, never its readers' (docs/jobs.md, Checks).
SLOT_ERRORS = (CroniterBadDateError, OverflowError)

# --- the app's own jobs -----------------------------------------------------------------

# Declared here (a settings module's CRONJOBS names it); registered while its app is installed (job_settings).
BUILTIN_JOBS = {
    "check_jobs": {
        "schedule": "* * * * *",
        "callable": "locks.contrib.alerts.jobs.check_jobs",
        "ttl": 120,
        "max_run_time": 300,
        "expected_errors": ["locks.contrib.alerts.jobs.AlertNotSent"],
    }
}


def with_builtin_jobs(jobs, *, enabled: bool = True):
    """``jobs`` (a ``LOCKS_JOBS`` value) with the app's own jobs it does not name, if ``enabled``;
    anything but a dict as it is (the checks refuse it)."""
    if not enabled or not isinstance(jobs, dict):
        return jobs
    return {**jobs, **{name: entry for name, entry in BUILTIN_JOBS.items() if name not in jobs}}


# --- reading LOCKS_JOBS into Jobs --------------------------------------------------------


class UnknownJob(LookupError):
    """No job (or no lock) of that name."""


class NoDryRun(ValueError):
    """The job names no ``dry_run`` callable."""


# Which slots run: "latest", or "all" within ``window`` (docs/jobs.md, "Register it").
CatchUp = namedtuple("CatchUp", "policy window", defaults=("latest", timedelta(seconds=86400)))
# check_jobs opens an incident after failures in a row or ``after`` without a success, closes it after recoveries.
AlertRules = namedtuple("AlertRules", "failures after recoveries", defaults=(2, None, 2))


@dataclass(frozen=True)
class Job:
    name: str
    cron: schedule.Schedule  # the cron expression, read in the job's time zone; its slots are UTC instants
    callable_path: str  # receives the lease, returns a mapping of counts or None
    ttl: timedelta
    # How long the heartbeat keeps renewing one run's lease; None: as long as it runs.
    max_run_time: timedelta | None
    retry_delays: tuple[timedelta, ...]  # after a failed tick (the scheduler's business)
    expected_errors: tuple[str, ...] = ()  # logged without a traceback
    dry_run_path: str | None = None  # no arguments, returns what a run would do
    catch_up: CatchUp = field(default_factory=CatchUp)
    alerts: AlertRules = field(default_factory=AlertRules)
    on_failover: str = "rerun"  # the first run after a database failover: "rerun" or "pause"
    # A django.tasks Task that the slot's winner enqueues and follows, instead of a callable.
    task_path: str | None = None

    @property
    def max_attempts(self) -> int:
        return attempts_of(self.retry_delays)

    def function(self) -> Callable[..., Mapping | None]:
        return import_string(self.callable_path)

    def error_classes(self) -> tuple[type[BaseException], ...]:
        return tuple(import_string(path) for path in self.expected_errors)

    def preview(self) -> dict:
        """What a run would do now, from its ``dry_run`` callable: no lease, no writes."""
        if self.dry_run_path is None:
            raise NoDryRun(f"job {self.name!r} has no dry run (no 'dry_run' in its LOCKS_JOBS entry)")
        return dict(import_string(self.dry_run_path)() or {})

    def current_tick(self, *, now: datetime | None = None) -> datetime:
        """The slot of now: the one a run at ``now`` (this host's clock) claims (``Schedule.current``)."""
        return self.cron.current(now or timezone.now(), window=tick_window())

    def chance_end(self, tick: datetime) -> datetime:
        """When ``tick``'s chance is over (if attempts remain): the next slot under the ``latest``
        catch-up policy, the catch-up window after the slot under ``all``."""
        return tick + self.catch_up.window if self.catch_up.policy == ALL else self.cron.next_slot(tick)

    def next_slots(self, *, after: datetime | None = None, count: int = 10) -> list[schedule.Upcoming]:
        """The ``count`` slots after ``after`` (default: now, this host's clock), UTC and local."""
        return self.cron.preview(after or timezone.now(), count)

    def alert_delay(self, *, now: datetime) -> timedelta:
        """How long without a success opens an incident: ``alerts.after``, else two periods and 10 minutes."""
        if self.alerts.after is not None:
            return self.alerts.after
        return 2 * self.cron.period(now) + timedelta(minutes=10)


def attempts_of(retry_delays: tuple[timedelta, ...] | None) -> int | None:
    """The attempts a tick gets across every host: the first, then one after each retry delay
    (rule 12); None without a retry policy: no limit."""
    return None if retry_delays is None else 1 + len(retry_delays)


def tick_window() -> timedelta:
    return timedelta(seconds=settings.LOCKS_TICK_WINDOW)


def job_settings() -> dict:
    """``LOCKS_JOBS`` with the app's own jobs added (``locks.registry``), as every reader sees it."""
    alerts = settings.LOCKS_CHECK_JOBS and apps.is_installed("locks.contrib.alerts")  # check_jobs' app
    return with_builtin_jobs(settings.LOCKS_JOBS, enabled=alerts)


def jobs() -> dict[str, Job]:
    """Every registered job, by name, in the order of ``LOCKS_JOBS`` (read once per process);
    ``ImproperlyConfigured`` with the first problem the system checks find."""
    return dict(_registry())


@receiver(setting_changed)
def _forget_registry(*, setting: str, **kwargs) -> None:
    if setting.startswith("LOCKS_") or setting == "INSTALLED_APPS":  # override_settings in tests
        _registry.cache_clear()


@cache
def _registry() -> dict[str, Job]:
    entries = job_settings()
    errors = job_setting_errors(entries)
    if errors:
        more = f" (and {len(errors) - 1} more: run `python manage.py check`)" if len(errors) > 1 else ""
        raise ImproperlyConfigured(f"{errors[0].msg}{more}")
    return {name: _job(name, entry) for name, entry in entries.items()}


def _job(name: str, entry: dict) -> Job:
    entry = {key: timedelta(seconds=value) if key in DURATION_KEYS else value for key, value in entry.items()}
    return Job(
        name=name,
        cron=schedule.Schedule(entry["schedule"], entry.get("timezone", schedule.DEFAULT_TIMEZONE)),
        callable_path=entry.get("callable", ""),
        ttl=entry.get("ttl", timedelta(seconds=settings.LOCKS_DEFAULT_TTL)),
        max_run_time=entry.get("max_run_time"),
        retry_delays=tuple(timedelta(seconds=s) for s in entry.get("retry", {}).get("delays", ())),
        expected_errors=tuple(entry.get("expected_errors", ())),
        dry_run_path=entry.get("dry_run"),
        catch_up=CatchUp(entry.get("catch_up", LATEST), entry.get("catch_up_window", CatchUp().window)),
        alerts=AlertRules(
            entry.get("alert_after_failures", AlertRules().failures),
            entry.get("alert_after"),
            entry.get("alert_after_recoveries", AlertRules().recoveries),
        ),
        on_failover=entry.get("on_failover", RERUN),
        task_path=entry.get("task"),
    )


def _job_or_none(name: str) -> Job | None:
    """The job ``name``; None for a name (``run_locked()`` takes any) or a setting that is no valid job."""
    try:
        return get_job(name)
    except (UnknownJob, ImproperlyConfigured):
        return None


def timezone_of(name: str) -> str:
    """The zone the job ``name`` reads its schedule in (UTC if no job): where a lock row's times are shown."""
    job = _job_or_none(name)
    return schedule.DEFAULT_TIMEZONE if job is None else job.cron.timezone


def prune_every(name: str) -> int:
    """Leases between two prunes of the job ``name``'s runs: an hour of its slots; 1 if no job."""
    job = _job_or_none(name)
    return 1 if job is None else math.ceil(timedelta(hours=1) / job.cron.period(timezone.now()))


def get_job(name: str) -> Job:
    registered = jobs()
    try:
        return registered[name]
    except KeyError:
        known = ", ".join(registered) or "none"
        raise UnknownJob(f"no job named {name!r} in LOCKS_JOBS (registered: {known})") from None


# --- validating LOCKS_JOBS (the system check adds the imports: locks.checks) ----------

# A job name is a lock's name (SyncLock.job_name, 100 characters), a URL path segment
# (/api/jobs/<job>/run) and part of a log file's name (var/<job>.log).
# Not starting with "-": cron and the CLI would read such a name as an option (``--force``).
JOB_NAME = re.compile(r"[a-z0-9_][a-z0-9_-]{0,99}\Z")
JOB_KEYS = (
    *("schedule", "callable", "ttl", "max_run_time", "retry", "expected_errors", "dry_run"),
    *("catch_up", "catch_up_window", "alert_after_failures", "alert_after", "alert_after_recoveries"),
    *("on_failover", "timezone", "task"),
)
LATEST, ALL = "latest", "all"  # the catch-up policies
RERUN, PAUSE = "rerun", "pause"  # what a failover means to a job
PATH_KEYS = ("callable", "dry_run", "task")  # dotted paths; one of callable and task is required
DURATION_KEYS = ("ttl", "max_run_time", "catch_up_window", "alert_after")  # in seconds, read as timedeltas

# One id per problem (docs/jobs.md, Checks).
NOT_A_DICT = "LOCKS_JOBS must be a dict of job name to job settings, got {type}."
BAD_SCHEDULE = "{where}: schedule {value!r} is not a valid cron expression."
NOT_A_PATH = "{where}: {key} must be the dotted path of a function, got {value!r}."
NOT_SECONDS = "{where}: {key} must be a positive whole number of seconds, got {value!r}."
NOT_A_COUNT = "{where}: {key} must be a positive whole number, got {value!r}."
BAD_RETRY = "{where}: retry must be {{'delays': [seconds, ...]}} with positive whole seconds, got {value!r}."
BAD_NAME = "LOCKS_JOBS: {name!r} is not a valid job name."
TWO_SPELLINGS = "LOCKS_JOBS names {first!r} and {name!r}: two spellings of one job."
ENTRY_NOT_A_DICT = "{where} must be a dict, got {type}."
UNKNOWN_KEYS = "{where} has unknown keys: {keys}."
NOT_PATHS = "{where}: expected_errors must be a list of dotted paths of exception classes, got {value!r}."
BAD_CATCH_UP = "{where}: catch_up must be 'latest' or 'all', got {value!r}."
BAD_ON_FAILOVER = "{where}: on_failover must be 'rerun' or 'pause', got {value!r}."
BAD_TIMEZONE = "{where}: timezone {value!r} is not an IANA time zone this host knows."
CALLABLE_AND_TASK = "{where} names both a callable and a task: a job runs one of them."
HINTS = {
    "locks.E010": 'e.g. {"sync": {"schedule": "0 * * * *", "callable": "myapp.tasks.sync"}}',
    "locks.E011": "Five fields, read in the job's timezone (UTC by default): minute hour day-of-month month day-of-week, e.g. '0 * * * *'.",
    "locks.E012": "e.g. 'myapp.tasks.sync'",
    "locks.E013": "The lease's length; the heartbeat renews it every third.",
    "locks.E014": "How long the heartbeat keeps renewing the lease of one run.",
    "locks.E015": "e.g. {'delays': [60, 300, 900]}: a failed tick is retried after 1, 5 and 15 minutes.",
    "locks.E016": "1 to 100 characters, each a lowercase letter, a digit, '_' or '-', not starting with '-' "
    "(no spaces, no shell metacharacters: cron, the CLI and URLs carry it).",
    "locks.E017": "Keep one entry per job.",
    "locks.E019": f"Known keys: {', '.join(JOB_KEYS)}.",
    "locks.E024": "'latest' (the default): a slot not done when the next one comes is missed; "
    "'all': every slot within catch_up_window runs once, oldest first.",
    "locks.E025": "How far back (seconds) catch_up 'all' runs slots that did not succeed; 86400 is the default.",
    "locks.E027": "'rerun' (the default): the first run after a failover runs as usual; "
    "'pause': it pauses the job, for an operator to decide before anything is done twice.",
    "locks.E030": "check_jobs opens an incident after this many failed slots in a row; 2 is the default.",
    "locks.E031": "check_jobs opens an incident after this long without a success (default: two periods + 600).",
    "locks.E032": "check_jobs closes an incident after this many succeeded slots in a row; 2 is the default.",
    "locks.E035": "Keep 'task' (a django.tasks Task the winner enqueues) or 'callable' (run in place).",
    "locks.E036": "A function decorated with @task (django.tasks on Django 6; on 5.2 the django-tasks "
    "backport: pip install 'django-tick-locks[tasks]').",
    "locks.E033": "An IANA name such as 'Europe/Berlin' or 'America/New_York' (the tzdata package's, "
    "not this host's zone files); 'UTC' is the default.",
}


def error(code: str, message: str, **values) -> Error:
    return Error(message.format(**values), hint=HINTS.get(code), id=code)


def job_setting_errors(jobs) -> list[Error]:
    """Every problem with ``jobs`` (the ``LOCKS_JOBS`` setting) that needs no import."""
    if not isinstance(jobs, dict):
        return [error("locks.E010", NOT_A_DICT, type=type(jobs).__name__)]
    errors = _name_errors(list(jobs))
    for name, entry in jobs.items():
        errors.extend(_entry_errors(f"LOCKS_JOBS[{name!r}]", entry))
    return errors


def _name_errors(names: list) -> list[Error]:
    # A dict cannot hold a name twice; what can go wrong is two spellings of one name
    # ("Sync" and "sync ") and names that cannot be a lock, a URL segment or a file name.
    errors = []
    seen: dict[str, object] = {}
    for name in names:
        key = name.strip().lower() if isinstance(name, str) else name
        if key in seen:
            errors.append(error("locks.E017", TWO_SPELLINGS, first=seen[key], name=name))
        elif not (isinstance(name, str) and JOB_NAME.match(name)):
            errors.append(error("locks.E016", BAD_NAME, name=name))
        seen.setdefault(key, name)
    return errors


def _entry_errors(where: str, entry) -> list[Error]:
    if not isinstance(entry, dict):
        return [error("locks.E018", ENTRY_NOT_A_DICT, where=where, type=type(entry).__name__)]
    errors = []
    unknown = sorted(str(key) for key in entry if key not in JOB_KEYS)
    if unknown:
        errors.append(error("locks.E019", UNKNOWN_KEYS, where=where, keys=", ".join(unknown)))
    if not schedule.is_valid_expression(entry.get("schedule")):
        errors.append(error("locks.E011", BAD_SCHEDULE, where=where, value=entry.get("schedule")))
    required = "task" if "task" in entry else "callable"
    for key in PATH_KEYS:
        path = entry.get(key)
        if not (isinstance(path, str) and path) and (key == required or path is not None):
            errors.append(error("locks.E012", NOT_A_PATH, where=where, key=key, value=path))
    if "task" in entry and "callable" in entry:
        errors.append(error("locks.E035", CALLABLE_AND_TASK, where=where))
    paths = entry.get("expected_errors", ())
    if not isinstance(paths, list | tuple) or not all(isinstance(path, str) and path for path in paths):
        errors.append(error("locks.E020", NOT_PATHS, where=where, value=paths))
    for key, code, message, valid in (  # each optional: its default is valid
        ("catch_up", "locks.E024", BAD_CATCH_UP, (LATEST, ALL).__contains__),
        ("on_failover", "locks.E027", BAD_ON_FAILOVER, (RERUN, PAUSE).__contains__),
        ("timezone", "locks.E033", BAD_TIMEZONE, schedule.is_valid_timezone),
        ("ttl", "locks.E013", NOT_SECONDS, _positive_int),
        ("max_run_time", "locks.E014", NOT_SECONDS, _positive_int),
        ("catch_up_window", "locks.E025", NOT_SECONDS, _positive_int),
        ("alert_after_failures", "locks.E030", NOT_A_COUNT, _positive_int),
        ("alert_after", "locks.E031", NOT_SECONDS, _positive_int),
        ("alert_after_recoveries", "locks.E032", NOT_A_COUNT, _positive_int),
    ):
        if key in entry and not valid(entry[key]):
            errors.append(error(code, message, where=where, key=key, value=entry[key]))
    retry = entry.get("retry", {"delays": ()})
    delays = retry.get("delays") if isinstance(retry, dict) else None
    if not (
        isinstance(delays, list | tuple) and set(retry) <= {"delays"} and all(map(_positive_int, delays))
    ):
        errors.append(error("locks.E015", BAD_RETRY, where=where, value=retry))
    return errors


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0
