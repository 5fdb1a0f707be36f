"""The project's settings with the test jobs registered beside the sync, for processes
started by tests (``DJANGO_SETTINGS_MODULE=tests.locks.settings``)."""

from config.settings import *  # noqa: F403
from config.settings import BASE_DIR, LOCKS_JOBS
from locks.crontab import cronjobs
from tests.locks.jobs import TEST_JOBS

LOCKS_JOBS = {**LOCKS_JOBS, **TEST_JOBS}
CRONJOBS = cronjobs(LOCKS_JOBS, log_dir=BASE_DIR / "var")
