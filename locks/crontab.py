"""The cron wiring: django-crontab's ``CRONJOBS`` from ``LOCKS_JOBS`` (one line per job),
and the environment file that line sources (``manage.py crontab_env``).

The line django-crontab installs is readable by anyone who can read the user's crontab,
and while it runs it is ``/bin/sh -c``'s command line, which every local user sees in
``/proc/*/cmdline``. So it carries no value: it sources the file, which only its owner
can read (docs/deployment-cron.md). Called from a settings module, so it imports
nothing from Django.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path

from locks.builtin import with_builtin_jobs

HEADER = (
    "# Written by `python manage.py crontab_env`; sourced by the crontab line (set -a).\n"
    "# Do not edit: change the environment and run the command again.\n"
)
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class CrontabEnvError(ValueError):
    """The environment cannot be written safely; nothing was written."""


def cron_escape(text: str) -> str:
    """``text`` for a crontab line: cron turns a bare % into a newline."""
    return text.replace("%", "\\%")


def cronjobs(jobs: Mapping[str, Mapping], *, log_dir: Path, check_jobs: bool = True) -> list[tuple]:
    """One ``manage.py run_job NAME --requested-by cron`` line per job, appending to
    ``log_dir/NAME.log``; with ``check_jobs`` (pass ``LOCKS_CHECK_JOBS``), the app's own
    ``check_jobs`` too (``locks.builtin``).

    The lock makes the line safe on every host: one run per tick. A malformed entry
    is left out, not an error here: the system checks name it (and ``crontab add``
    runs them first).
    """
    return [
        (
            job.get("schedule"),
            "django.core.management.call_command",
            ["run_job", name],
            {"verbosity": 0, "requested_by": "cron"},  # the log line on stderr is the record
            cron_escape(f">> {shlex.quote(str(log_dir / f'{name}.log'))} 2>&1"),
        )
        for name, job in with_builtin_jobs(jobs, enabled=check_jobs).items()
        if isinstance(job, Mapping)
    ]


def command_prefix(env_file: Path) -> str:
    """django-crontab's ``CRONTAB_COMMAND_PREFIX``: source ``env_file`` (written by
    ``crontab_env``); umask 027, so the log the line appends to is created 0640."""
    return cron_escape(f"umask 027; set -a; . {shlex.quote(str(env_file))}; set +a;")


def crontab_environment(*, environ: Mapping[str, str], prefixes: Iterable[str]) -> dict[str, str]:
    """The variables the cron line needs: every non-empty one whose name starts with a prefix.

    Raises ``CrontabEnvError`` for a value with a line break (in a crontab it would
    start a line of its own) or a name the shell cannot assign.
    """
    prefixes = tuple(prefixes)
    chosen = {name: value for name, value in sorted(environ.items()) if name.startswith(prefixes) and value}
    for name, value in chosen.items():
        if not NAME.match(name):
            raise CrontabEnvError(f"{name!r} is not a name the shell can assign; nothing was written")
        if "\n" in value or "\r" in value:
            raise CrontabEnvError(
                f"{name} contains a newline or carriage return; refusing to write it, nothing was written"
            )
    return chosen


def write_crontab_env(*, path: Path, variables: Mapping[str, str]) -> None:
    """Replace ``path`` with ``NAME='value'`` lines, mode 0600 from its creation on.

    The file is written under a temporary name created 0600 with ``O_EXCL`` (never
    readable by others, not even for a moment) and renamed over ``path``, so a reader
    sees the old file or the new one, never half of one.
    """
    text = HEADER + "".join(f"{name}={shlex.quote(value)}\n" for name, value in variables.items())
    path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
    temporary = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as out:
            os.fchmod(out.fileno(), 0o600)  # whatever the umask took away from the owner
            out.write(text)
            out.flush()
            os.fsync(out.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise
