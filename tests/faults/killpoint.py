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

    from contests import services
    from contests.models import Contest

    original = services._create_contests

    def create_contests(new, **kwargs):
        # Whichever path inserts (the SQL fast path or bulk_create), stop halfway.
        if len(new) < 2:
            return original(new, **kwargs)
        half = len(new) // 2
        original(new[:half], **kwargs)
        print(f"MID-WRITE rows={Contest.objects.count()}", flush=True)
        time.sleep(120)  # the test kills the process long before this ends
        return original(new[half:], **kwargs)

    services._create_contests = create_contests
    execute_from_command_line(["manage.py", *sys.argv[1:]])


if __name__ == "__main__":
    main()
