import re

from django.conf import settings
from django.core.checks import Error, Tags, register
from django.utils.module_loading import import_string

from locks.leases import error_text
from locks.schedule import is_valid_expression


@register(Tags.compatibility)
def check_lock_settings(app_configs=None, **kwargs) -> list[Error]:
    # The settings module reads these as integers; only the sign is left to check.
    errors = []
    ttl = getattr(settings, "LOCKS_DEFAULT_TTL", 300)
    if ttl <= 0:
        errors.append(
            Error(
                f"LOCKS_DEFAULT_TTL must be a positive number of seconds, got {ttl!r}.",
                hint="A lease that expires at once would let every copy of a job run.",
                id="locks.E001",
            )
        )
    retention = getattr(settings, "LOCKS_RUN_RETENTION_DAYS", 30)
    if retention <= 0:
        errors.append(
            Error(
                f"LOCKS_RUN_RETENTION_DAYS must be a positive whole number, got {retention!r}.",
                id="locks.E002",
            )
        )
    window = getattr(settings, "LOCKS_TICK_WINDOW", 300)
    if not isinstance(window, int) or isinstance(window, bool) or window < 0:
        errors.append(
            Error(
                f"LOCKS_TICK_WINDOW must be a whole number of seconds, 0 or more, got {window!r}.",
                hint="How early a run may claim the upcoming slot; 300 (5 minutes) is the default.",
                id="locks.E003",
            )
        )
    return errors


# --- LOCKS_JOBS (locks.registry; docs/jobs.md) ------------------------------------------

# A job name is a lock's name (SyncLock.job_name, 100 characters), a URL path segment
# (/api/jobs/<job>/run) and part of a log file's name (var/<job>.log).
JOB_NAME = re.compile(r"[a-z0-9_-]{1,100}\Z")
JOB_KEYS = ("schedule", "callable", "ttl", "max_run_time", "retry", "expected_errors", "dry_run")
RETRY_KEYS = ("delays",)


@register(Tags.compatibility)
def check_jobs_setting(app_configs=None, **kwargs) -> list[Error]:
    return job_setting_errors(getattr(settings, "LOCKS_JOBS", {}), imports=True)


def job_setting_errors(jobs, *, imports: bool) -> list[Error]:
    """Every problem with ``jobs`` (the ``LOCKS_JOBS`` setting).

    ``imports``: also import each dotted path (the check does; ``locks.registry``
    leaves importing to the moment a job runs).
    """
    if not isinstance(jobs, dict):
        return [
            Error(
                f"LOCKS_JOBS must be a dict of job name to job settings, got {type(jobs).__name__}.",
                hint='e.g. {"sync": {"schedule": "0 * * * *", "callable": "myapp.tasks.sync"}}',
                id="locks.E010",
            )
        ]
    errors = _name_errors(list(jobs))
    for name, entry in jobs.items():
        errors.extend(_entry_errors(name, entry, imports=imports))
    return errors


def _name_errors(names: list) -> list[Error]:
    # A dict cannot hold a name twice; what can go wrong is two spellings of one name
    # ("Sync" and "sync ") and names that cannot be a lock, a URL segment or a file name.
    errors = []
    seen: dict[str, object] = {}
    for name in names:
        key = name.strip().lower() if isinstance(name, str) else name
        if key in seen:
            errors.append(
                Error(
                    f"LOCKS_JOBS names {seen[key]!r} and {name!r}: two spellings of one job.",
                    hint="Keep one entry per job.",
                    id="locks.E016",
                )
            )
        elif not (isinstance(name, str) and JOB_NAME.match(name)):
            errors.append(
                Error(
                    f"LOCKS_JOBS: {name!r} is not a valid job name.",
                    hint="1 to 100 characters, each a lowercase letter, a digit, '_' or '-'.",
                    id="locks.E016",
                )
            )
        seen.setdefault(key, name)
    return errors


def _entry_errors(name, entry, *, imports: bool) -> list[Error]:
    where = f"LOCKS_JOBS[{name!r}]"
    if not isinstance(entry, dict):
        return [Error(f"{where} must be a dict, got {type(entry).__name__}.", id="locks.E010")]
    errors = []
    unknown = sorted(str(key) for key in entry if key not in JOB_KEYS)
    if unknown:
        errors.append(
            Error(
                f"{where} has unknown keys: {', '.join(unknown)}.",
                hint=f"Known keys: {', '.join(JOB_KEYS)}.",
                id="locks.E010",
            )
        )
    schedule = entry.get("schedule")
    if not is_valid_expression(schedule):
        errors.append(
            Error(
                f"{where}: schedule {schedule!r} is not a valid cron expression.",
                hint="Five fields, read in UTC: minute hour day-of-month month day-of-week, e.g. '0 * * * *'.",
                id="locks.E011",
            )
        )
    errors.extend(_path_errors(where, "callable", entry.get("callable"), required=True, imports=imports))
    errors.extend(_path_errors(where, "dry_run", entry.get("dry_run"), required=False, imports=imports))
    errors.extend(_expected_errors_errors(where, entry.get("expected_errors", ()), imports=imports))
    for key, code, hint in (
        ("ttl", "locks.E013", "The lease's length; the heartbeat renews it every third."),
        ("max_run_time", "locks.E014", "How long the heartbeat keeps renewing the lease of one run."),
    ):
        if key in entry and not _positive_int(entry[key]):
            errors.append(
                Error(
                    f"{where}: {key} must be a positive whole number of seconds, got {entry[key]!r}.",
                    hint=hint,
                    id=code,
                )
            )
    if "retry" in entry:
        errors.extend(_retry_errors(where, entry["retry"]))
    return errors


def _positive_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _path_errors(where: str, key: str, path, *, required: bool, imports: bool) -> list[Error]:
    if path is None and not required:
        return []
    if not isinstance(path, str) or not path:
        return [
            Error(
                f"{where}: {key} must be the dotted path of a function, got {path!r}.",
                hint="e.g. 'myapp.tasks.sync'",
                id="locks.E012",
            )
        ]
    if imports:
        try:
            target = import_string(path)
        except Exception as exc:  # ImportError, or whatever importing the module raised
            return [Error(f"{where}: {key} {path!r} cannot be imported: {error_text(exc)}.", id="locks.E012")]
        if not callable(target):
            return [Error(f"{where}: {key} {path!r} is not callable.", id="locks.E012")]
    return []


def _expected_errors_errors(where: str, paths, *, imports: bool) -> list[Error]:
    if not isinstance(paths, list | tuple) or not all(isinstance(path, str) and path for path in paths):
        return [
            Error(
                f"{where}: expected_errors must be a list of dotted paths of exception classes, got {paths!r}.",
                id="locks.E010",
            )
        ]
    errors = []
    for path in paths if imports else ():
        try:
            target = import_string(path)
        except Exception as exc:
            errors.append(
                Error(
                    f"{where}: expected error {path!r} cannot be imported: {error_text(exc)}.",
                    id="locks.E012",
                )
            )
            continue
        if not (isinstance(target, type) and issubclass(target, BaseException)):
            errors.append(
                Error(f"{where}: expected error {path!r} is not an exception class.", id="locks.E012")
            )
    return errors


def _retry_errors(where: str, retry) -> list[Error]:
    delays = retry.get("delays") if isinstance(retry, dict) else None
    if (
        not isinstance(retry, dict)
        or set(retry) - set(RETRY_KEYS)
        or not isinstance(delays, list | tuple)
        or not all(_positive_int(delay) for delay in delays)
    ):
        return [
            Error(
                f"{where}: retry must be {{'delays': [seconds, ...]}} with positive whole seconds, got {retry!r}.",
                hint="e.g. {'delays': [60, 300, 900]}: a failed tick is retried after 1, 5 and 15 minutes.",
                id="locks.E015",
            )
        ]
    return []
