"""One scenario, four periodic schedulers for django.tasks: docs/periodic-comparison.md.

    make compare-periodic          # or: scripts/with-postgres.sh .venv/bin/python -m bench.compare_periodic

Each third-party tool gets a throwaway venv under var/compare/<tool> (Python 3.13, pinned versions,
created here with ``python -m venv`` and pip) and runs site/, a minimal project whose one task,
every minute, appends a line when it starts and one when it ends; this project runs its host
project's "slot_task" job (tests/hostproject, django-tasks-db) and "outbox_task" (the outbox, a
backend outside the database) from .venv. All on PostgreSQL (django-periodic-tasks
needs its row locks), one database each, at the same time, on the same real minutes:

    S1 - 25 s   3 replicas of the tool's scheduler start (and one task worker, where it has one)
    S2 + 20 s   SIGKILL to one replica (the one doing slot 2's work where it can be told)
    S3 + 40 s   every replica stopped (SIGTERM): the slot S4 passes with none running
    S4 + 30 s   3 new replicas start
    S6 + 55 s   everything stopped; the task rows and the task's lines counted per slot

It prints the per-slot counts and writes them to var/compare/results.json. Nothing asserts them:
they are measured, and docs/periodic-comparison.md explains them from each tool's source.
"""
