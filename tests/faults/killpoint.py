"""``manage.py`` with a pause in the middle of the sync's write transaction.

    python -m tests.faults.killpoint sync_contests --tick …

The first half of the new contests is inserted (for real, inside the sync's
transaction), then the process prints ``MID-WRITE rows=N`` (the rows it sees
inside its own transaction) and sleeps, so a test can SIGKILL it right there.
Nothing in the database is faked: only the moment is made deterministic.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.core.management import execute_from_command_line

    from contests.models import Contest, ContestQuerySet

    original = ContestQuerySet.bulk_create

    def bulk_create(self, objs, *args, **kwargs):
        # The sync's one bulk_create of new contests: stop after its first half.
        objs = list(objs)
        if len(objs) < 2:
            return original(self, objs, *args, **kwargs)
        half = len(objs) // 2
        created = original(self, objs[:half], *args, **kwargs)
        print(f"MID-WRITE rows={Contest.objects.count()}", flush=True)
        time.sleep(120)  # the test kills the process long before this ends
        return created + original(self, objs[half:], *args, **kwargs)

    ContestQuerySet.bulk_create = bulk_create
    execute_from_command_line(["manage.py", *sys.argv[1:]])


if __name__ == "__main__":
    main()
