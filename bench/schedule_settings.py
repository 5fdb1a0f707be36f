"""The project's settings with ``BENCH_SCHED_JOBS`` no-op jobs scheduled ``* * * * *`` and
nothing else (bench part ``schedule``): what ``run_scheduler`` costs per job, per replica."""

import os

from config.settings import *  # noqa: F403

LOCKS_JOBS = {
    f"noop_{number:04d}": {"schedule": "* * * * *", "callable": "bench.schedule_jobs.noop", "ttl": 60}
    for number in range(int(os.environ.get("BENCH_SCHED_JOBS", "10")))
}
LOCKS_CHECK_JOBS = False  # check_jobs would be one more job every minute
LOCKS_HEALTHZ_JOB = ""
CRONJOBS: list = []
