"""django-tasks-db's backend, with a death a test asks for (TASK_DIE): "before", the process dies
before it enqueues (its slot claimed); "after", once the task's row is inserted, before the
transaction commits. tests/locks/test_tasks.py: no slot without its task, no task without its slot."""

import os

from django_tasks_db import DatabaseBackend


class DyingBackend(DatabaseBackend):
    def enqueue(self, task, args, kwargs):
        if os.environ.get("TASK_DIE") == "before":
            os._exit(9)
        result = super().enqueue(task, args, kwargs)
        if os.environ.get("TASK_DIE") == "after":
            os._exit(9)
        return result
