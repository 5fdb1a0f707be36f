"""django-crontab's ``CRONJOBS`` from ``LOCKS_JOBS``: one line per job.

Called from the settings module, so it imports nothing from Django.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping
from pathlib import Path


def cronjobs(jobs: Mapping[str, Mapping], *, log_dir: Path) -> list[tuple]:
    """One ``manage.py run_job NAME`` line per job, appending to ``log_dir/NAME.log``.

    The lock makes the line safe on every host: one run per tick. A malformed entry
    is left out, not an error here: the system checks name it (and ``crontab add``
    runs them first).
    """
    return [
        (
            job.get("schedule"),
            "django.core.management.call_command",
            ["run_job", name],
            {"verbosity": 0},  # the log line on stderr is the record
            # Quoted for the shell; % escaped: cron turns a bare % into a newline.
            f">> {shlex.quote(str(log_dir / f'{name}.log'))} 2>&1".replace("%", "\\%"),
        )
        for name, job in jobs.items()
        if isinstance(job, Mapping)
    ]
