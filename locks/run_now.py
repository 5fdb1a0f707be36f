"""Run now: start ``manage.py run_job NAME --force --requested-by WHO`` as a background process of
its own, so an admin request answers at once and never runs a job itself. The run is the same
as on the command line: under the lease, never beside another holder, stopped by a pause, and
recorded on its ``JobRun`` with who asked (docs/admin.md, "Pause, resume, run now").
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading

from django.conf import settings

logger = logging.getLogger("locks.api")


def run_now_command(*, job: str, requested_by: str) -> list[str]:
    """This interpreter's ``python -m django run_job …`` under this process's settings module
    (overridden settings, as in tests, name none: then the environment's)."""
    module = settings.SETTINGS_MODULE or os.environ.get("DJANGO_SETTINGS_MODULE")
    return [
        sys.executable,
        *("-m", "django", "run_job", job, "--force", "--requested-by", requested_by),
        *(("--settings", module) if module else ()),
    ]


def start_run_now(*, job: str, requested_by: str) -> int:
    """Start a forced run of ``job`` in the background and return its pid; raises ``OSError`` when
    it cannot be started. It inherits this process's environment and import path (so it reaches
    the same database), runs in a session of its own (a worker that restarts does not stop it),
    and writes its log line to this process's stderr; a thread waits for it, so it leaves no zombie."""
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(path for path in sys.path if path)}
    process = subprocess.Popen(
        run_now_command(job=job, requested_by=requested_by),
        cwd=os.getcwd(),
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        start_new_session=True,
    )
    threading.Thread(target=process.wait, name=f"run-now-{job}-{process.pid}", daemon=True).start()
    logger.warning("job=%s run now requested by %s: started pid %s", job, requested_by, process.pid)
    return process.pid
