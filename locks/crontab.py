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
import stat
import sys
from collections.abc import Iterable, Mapping
from pathlib import Path

from locks.registry import with_builtin_jobs

HEADER = (
    "# Written by `python manage.py crontab_env`; sourced by the crontab line (set -a).\n"
    "# Do not edit: change the environment and run the command again.\n"
)
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Written into the file itself, so a job started from it knows which file that was (run_job
# refuses to start when others can read it: ``check_env_file``).
ENV_FILE_VARIABLE = "LOCKS_CRON_ENV_FILE"


class CrontabEnvError(ValueError):
    """The environment cannot be written safely; nothing was written."""


def cron_escape(text: str) -> str:
    """``text`` for a crontab line: cron turns a bare % into a newline."""
    return text.replace("%", "\\%")


def cronjobs(jobs: Mapping[str, Mapping], *, log_dir: Path, check_jobs: bool = True) -> list[tuple]:
    """One line per job, running ``run_job NAME --requested-by cron`` (through ``run``) and
    appending to ``log_dir/NAME.log``; with ``check_jobs`` (pass ``LOCKS_CHECK_JOBS``), the
    app's own ``check_jobs`` too (``locks.registry``).

    The lock makes the line safe on every host: one run per tick. A malformed entry
    is left out, not an error here: the system checks name it (and ``crontab add``
    runs them first).
    """
    return [
        (
            job.get("schedule"),
            "locks.crontab.run",
            [name],
            {},
            cron_escape(f">> {shlex.quote(str(log_dir / f'{name}.log'))} 2>&1"),
        )
        for name, job in with_builtin_jobs(jobs, enabled=check_jobs).items()
        if isinstance(job, Mapping)
    ]


def run(name: str) -> None:
    """What a crontab line runs (django-crontab's ``crontab run HASH``): ``run_job NAME``, and
    the process ends with run_job's exit status.

    django-crontab catches every exception a job raises, ``SystemExit`` included, and logs it
    with a traceback, then exits 0. So a run that failed (exit 1) or was refused (exit 2, one
    ``CommandError`` line) ends the process here, after its one line, with its status.
    """
    from django.core.management import call_command
    from django.core.management.base import CommandError

    try:
        call_command("run_job", name, verbosity=0, requested_by="cron")  # its log line is the record
        return
    except CommandError as exc:
        sys.stderr.write(f"CommandError: {exc}\n")
        status = exc.returncode
    except SystemExit as exc:
        status = exc.code if isinstance(exc.code, int) else 1
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(status)  # not SystemExit: django-crontab would catch it and log a traceback


def check_env_file(environ: Mapping[str, str]) -> None:
    """Raise ``CrontabEnvError`` when the environment file this process was started with
    (``ENV_FILE_VARIABLE``, written into the file by ``crontab_env``) can be read by its
    group or by others: it holds the database password and the secret key."""
    path = environ.get(ENV_FILE_VARIABLE)
    if not path:
        return
    try:
        mode = stat.S_IMODE(os.stat(path).st_mode)
    except OSError as exc:
        raise CrontabEnvError(f"cannot check the environment file {path}: {exc.strerror or exc}") from None
    if mode & 0o077:
        raise CrontabEnvError(
            f"the environment file {path} is readable by group or others (mode {mode:04o}): "
            f"run `chmod 600 {shlex.quote(path)}` or `manage.py crontab_env` again"
        )


def command_prefix(env_file: Path) -> str:
    """django-crontab's ``CRONTAB_COMMAND_PREFIX``: source ``env_file`` (written by
    ``crontab_env``); umask 027, so the log the line appends to is created 0640."""
    return cron_escape(f"umask 027; set -a; . {shlex.quote(str(env_file))}; set +a;")


def crontab_environment(*, environ: Mapping[str, str], names: Iterable[str]) -> dict[str, str]:
    """The variables the cron line needs: each of ``names`` (an explicit list of what a job
    reads, ``LOCKS_CRONTAB_ENV_VARIABLES``) that is set and not empty; nothing else, so
    tokens the web process needs and passwords of other tools stay out of the file.

    Raises ``CrontabEnvError`` for a value with a line break (in a crontab it would
    start a line of its own) or a name the shell cannot assign.
    """
    chosen = {name: environ[name] for name in sorted(set(names)) if environ.get(name)}
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
    variables = {ENV_FILE_VARIABLE: str(path), **variables}
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
