"""``manage.py`` with a pause at one step of a reminder's delivery.

    python -m tests.contests.reminder_killpoint claimed send_reminders --force
    python -m tests.contests.reminder_killpoint sent send_reminders --force

``claimed``: the first reminder is claimed (for real, in the database), then the
process prints ``CLAIMED pk=N`` and sleeps before sending it. ``sent``: its email
is sent (for real, through the configured backend), then the process prints
``SENT pk=N`` and sleeps before recording the delivery. Either way a test can
SIGKILL it right there: only the moment is made deterministic.
"""

from __future__ import annotations

import os
import sys
import time


def main() -> None:
    point, *command = sys.argv[1:]
    if point not in {"claimed", "sent"}:
        raise SystemExit(f"kill point must be 'claimed' or 'sent', not {point!r}")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.core.management import execute_from_command_line

    from contests import reminders

    original = reminders.send_reminder

    def send_reminder(*, reminder, connection, now=None):
        if point == "claimed":
            print(f"CLAIMED pk={reminder.pk}", flush=True)
            time.sleep(120)  # the test kills the process long before this ends
        sent = original(reminder=reminder, connection=connection, now=now)
        print(f"SENT pk={reminder.pk}", flush=True)
        time.sleep(120)
        return sent

    reminders.send_reminder = send_reminder
    execute_from_command_line(["manage.py", *command])


if __name__ == "__main__":
    main()
