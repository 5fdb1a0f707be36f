"""The one periodic task, every minute: it appends a line when it starts and one when it ends
(pid, time, when it began, arguments) to CMP_HITS, and takes CMP_TASK_SECONDS in between."""

import json
import os
import time

from django.conf import settings
from django.tasks import task


def _hit(event: str, kwargs: dict, began: float) -> None:
    line = json.dumps(
        {"event": event, "pid": os.getpid(), "at": time.time(), "began": began, "kwargs": kwargs}
    )
    with open(os.environ["CMP_HITS"], "a") as hits:  # one short O_APPEND write a line
        hits.write(line + "\n")


def _body(**kwargs) -> None:
    began = time.time()
    _hit("start", kwargs, began)
    time.sleep(float(os.environ.get("CMP_TASK_SECONDS", "0")))
    _hit("end", kwargs, began)


if settings.TOOL == "periodic_tasks":
    from django_periodic_tasks import exactly_once, scheduled_task

    @scheduled_task(cron="* * * * *", name="tick")
    @task
    @exactly_once  # the tool's strongest mode: an execution record per run, checked here
    def tick(**kwargs) -> None:
        _body(**kwargs)

elif settings.TOOL == "crontask":
    from crontask import cron

    @cron("* * * * *", sentry_monitor_config=None)
    @task
    def tick(**kwargs) -> None:
        _body(**kwargs)

else:  # dbtasks: the schedule is its backend's OPTIONS["periodic"] (cmpsite.py)

    @task
    def tick(**kwargs) -> None:
        _body(**kwargs)
