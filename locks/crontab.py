"""The cron wiring: django-crontab's ``CRONJOBS`` (one line a minute, whose pass runs the due jobs)
and the environment file it sources (docs/deployment-cron.md). Imports nothing from Django at import
time: a settings module calls it."""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import stat
import sys
from collections.abc import Iterable, Mapping
from datetime import datetime, timedelta
from pathlib import Path

from locks.registry import with_builtin_jobs

HEADER = (
    "# Written by `python manage.py crontab_env`; sourced by the crontab line (set -a).\n"
    "# Do not edit: change the environment and run the command again.\n"
)
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")
# Written into the file itself, so a job started from it can check the file (``check_env_file``).
ENV_FILE_VARIABLE = "LOCKS_CRON_ENV_FILE"


class CrontabEnvError(ValueError):
    """The environment cannot be written safely; nothing was written."""


def cron_escape(text: str) -> str:
    """``text`` for a crontab line: cron turns a bare % into a newline."""
    return text.replace("%", "\\%")


# The crontab line runs every minute; each pass runs the jobs whose slot came within it.
PASS = 60  # seconds
CRON_LOG = "cron.log"  # the pass's own output; each job's run appends to NAME.log


def cronjobs(jobs: Mapping[str, Mapping], *, log_dir: Path, check_jobs: bool = True) -> list[tuple]:
    """One line, every minute (not the jobs' expressions: cron reads those in the host's zone), running
    ``run_due`` for the jobs, with ``check_jobs`` the app's own too; each job appends to
    ``log_dir/NAME.log``. A malformed entry is left out: the system checks name it."""
    names = [
        name for name, job in with_builtin_jobs(jobs, enabled=check_jobs).items() if isinstance(job, Mapping)
    ]
    if not names:
        return []
    suffix = cron_escape(f">> {shlex.quote(str(log_dir / CRON_LOG))} 2>&1")
    return [("* * * * *", "locks.crontab.run_due", names, {"log_dir": str(log_dir)}, suffix)]


def run_due(*names: str, log_dir: str) -> None:
    """What the crontab line runs (``crontab run HASH``): ``run`` for each due job, each in a child
    process whose output goes to ``log_dir/NAME.log``, all at once; it ends with their highest status."""
    from django.db import connections
    from django.utils import timezone

    from locks.db import error_text

    due, holder = _claimed(names, now=timezone.now())
    connections.close_all()  # no connection is shared with a child
    sys.stdout.flush()
    sys.stderr.flush()
    children, codes = {}, {}
    for name, tick in due.items():
        try:
            children[_start(name, tick, Path(log_dir))] = name
        except OSError as exc:  # the pid limit (EAGAIN), no memory: this one broke, the others still start
            why = f"no process could be started for its run ({error_text(exc)})"
            print(f"job={name} tick={tick.isoformat()} holder={holder} outcome=broke error={why}", flush=True)
            codes[name] = 1
    for name in codes:  # once every child is started: a connection now is the pass's own
        _end_claim(name, due[name], holder, status="broke")
    while children:  # each claim ends with its run, not with the pass's slowest
        pid, waited = os.wait()
        if (name := children.pop(pid, None)) is not None:
            codes[name] = os.waitstatus_to_exitcode(waited)
            _end_claim(name, due[name], holder)
    status = max(codes.values(), default=0)
    if status:
        os._exit(status if status > 0 else 1)  # not SystemExit: django-crontab would log a traceback


def _end_claim(name: str, tick: datetime, holder: str | None, *, status: str = "asked") -> None:
    """A pass asks once: the claim of a slot its run settled lasts its TTL (each run recorded how it
    went); any other's ends now (failed, broke, or skipped: held, paused, unreachable), for a scheduler
    to ask. Nothing without a claim (``holder`` None) or a database."""
    from django.db import DatabaseError
    from django.db.models.functions import Now

    from locks.models import SyncLock, Tick

    if holder is None:
        return
    with contextlib.suppress(DatabaseError):
        settled = SyncLock.objects.filter(job_name=name, tick=tick, tick_done=True).exists()
        Tick.objects.filter(holder=holder, job_name=name).update(
            status=status, **({} if settled else {"until": Now()})
        )


def _claimed(names: Iterable[str], *, now) -> tuple[dict[str, datetime], str | None]:
    """Those of ``names`` due at ``now`` (a slot in (``now`` - PASS, ``now``]) whose slot this pass
    claimed (locks.models.Tick, one statement), each with its slot, and its holder; every due one, and
    None, when the claim cannot be made (their leases decide)."""
    from django.db import DatabaseError

    from locks.lease import make_holder
    from locks.models import Tick
    from locks.registry import jobs

    holder, registered = make_holder(), jobs()
    slots = {name: registered[name].cron.slot_at_or_before(now) for name in names if name in registered}
    ticks = {name: tick for name, tick in slots.items() if now - timedelta(seconds=PASS) < tick}
    try:
        won = Tick.objects.claim(
            [(name, tick, registered[name].ttl) for name, tick in ticks.items()], holder=holder
        )
    except DatabaseError:
        return ticks, None
    for name in sorted(set(ticks) - won):
        print(
            f"job={name} tick={ticks[name].isoformat()} holder={holder} outcome=skipped reason=claimed by another copy"
        )
    return {name: tick for name, tick in ticks.items() if name in won}, holder


def _start(name: str, tick: datetime, log_dir: Path) -> int:
    pid = os.fork()
    if pid:
        return pid
    status = 1
    try:
        log = os.open(log_dir / f"{name}.log", os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o666)  # umask: 0640
        os.dup2(log, 1)
        os.dup2(log, 2)
        os.close(log)
        run(name, tick)
        status = 0
    except BaseException:
        import traceback

        traceback.print_exc()
    finally:
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(status)


def run(name: str, tick: datetime) -> None:
    """``run_job NAME`` of the slot ``tick`` the pass claimed (not the slot of now, which late in a period
    is the next), the process ending with its exit status, after its one line (django-crontab would log
    a failed or refused run's exception with a traceback and exit 0)."""
    from django.core.management import call_command
    from django.core.management.base import CommandError

    try:
        call_command("run_job", name, verbosity=0, requested_by="cron", slot=tick)  # its log line: the record
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
    """Each of ``names`` (``LOCKS_CRONTAB_ENV_VARIABLES``) set and not empty in ``environ``, nothing else;
    ``CrontabEnvError`` for a value with a line break or a name the shell cannot assign."""
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
    """Replace ``path`` with ``NAME='value'`` lines: a temporary file created 0600 with ``O_EXCL``,
    renamed over ``path`` (a reader sees the old file or the new one)."""
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
