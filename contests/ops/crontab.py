"""The environment file the crontab line sources (``manage.py crontab_env``).

The line django-crontab installs is readable by anyone who can read the user's
crontab, and while it runs it is ``/bin/sh -c``'s command line, which every local
user sees in ``/proc/*/cmdline``. So it carries no value: it sources this file,
which only its owner can read. See docs/deployment-cron.md.
"""

from __future__ import annotations

import os
import re
import shlex
from collections.abc import Iterable, Mapping
from pathlib import Path

HEADER = (
    "# Written by `python manage.py crontab_env`; sourced by the crontab line (set -a).\n"
    "# Do not edit: change the environment and run the command again.\n"
)
NAME = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\Z")


class CrontabEnvError(ValueError):
    """The environment cannot be written safely; nothing was written."""


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
