"""django-tasks-db's backend, with a death a test asks for (TASK_DIE): "before", the process dies
before it enqueues (its slot claimed); "after", once the task's row is inserted, before the
transaction commits. tests/locks/test_tasks.py: no slot without its task, no task without its slot.
OutsideBackend: one outside the database (tests/locks/test_task_outbox.py)."""

import json
import os
import sqlite3

from django_tasks_db import DatabaseBackend

try:
    from django.tasks.backends.base import BaseTaskBackend
    from django.tasks.backends.immediate import ImmediateBackend
except ImportError:
    from django_tasks.backends.base import BaseTaskBackend
    from django_tasks.backends.immediate import ImmediateBackend


class DyingBackend(DatabaseBackend):
    def enqueue(self, task, args, kwargs):
        if os.environ.get("TASK_DIE") == "before":
            os._exit(9)
        result = super().enqueue(task, args, kwargs)
        if os.environ.get("TASK_DIE") == "after":
            os._exit(9)
        return result


class OutsideBackend(BaseTaskBackend):
    """A backend outside the job's database, as Redis or RQ are: each task sent is a row of its own
    SQLite file (OUTSIDE_TASKS, its own connection), then runs at once, as ImmediateBackend runs it.
    TASK_DIE "before" or "after" the send; TASK_REDELIVER: each task is delivered twice."""

    _execute_task = ImmediateBackend._execute_task

    def __init__(self, alias, params):
        super().__init__(alias, params)
        self.worker_id = "outside"

    def enqueue(self, task, args, kwargs):
        if os.environ.get("TASK_DIE") == "before":
            os._exit(9)
        with sqlite3.connect(os.environ["OUTSIDE_TASKS"]) as db:
            db.execute("CREATE TABLE IF NOT EXISTS sent (kwargs TEXT)")
            db.execute("INSERT INTO sent VALUES (?)", (json.dumps(kwargs),))
        db.close()
        result = ImmediateBackend.enqueue(self, task, args, kwargs)
        if os.environ.get("TASK_REDELIVER"):
            self._execute_task(result)
        if os.environ.get("TASK_DIE") == "after":
            os._exit(9)
        return result


def sent_outside() -> list[dict]:
    """What OutsideBackend sent, oldest first."""
    with sqlite3.connect(os.environ["OUTSIDE_TASKS"]) as db:
        db.execute("CREATE TABLE IF NOT EXISTS sent (kwargs TEXT)")
        rows = [json.loads(kwargs) for (kwargs,) in db.execute("SELECT kwargs FROM sent ORDER BY rowid")]
    db.close()
    return rows
