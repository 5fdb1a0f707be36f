"""``manage.py`` with a pause at one step of the reminders' delivery.

    python -m tests.contests.reminder_killpoint claimed send_reminders --force
    python -m tests.contests.reminder_killpoint sent:120 send_reminders --force

``claimed``: the first batch is claimed (for real, in the database), then the process
prints ``CLAIMED n=<reminders> claim=<id>`` and sleeps before sending any of it.
``sent:K``: the K-th email is handed to the mail server (for real, through the
configured backend), then the process prints ``SENT n=K pk=<its reminder>`` and sleeps
before anything else, so the group it belongs to is not recorded. Either way a test can
SIGKILL it right there: only the moment is made deterministic.
"""

from __future__ import annotations

import os
import sys
import time

POINTS = {"claimed", "sent"}


def main() -> None:
    point, *command = sys.argv[1:]
    name, _, count = point.partition(":")
    if name not in POINTS or (name != "claimed") != count.isdigit():
        raise SystemExit(f"kill point must be 'claimed' or 'sent:K', not {point!r}")
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from django.core.management import execute_from_command_line

    from contests import reminders, senders
    from contests.mail import Outcome

    claim_batch, send_reminder, sent = reminders.claim_batch, senders.send_reminder, []

    def claim_then_pause(**kwargs):
        claimed = claim_batch(**kwargs)
        if claimed:
            print(f"CLAIMED n={claimed} claim={kwargs['claim']}", flush=True)
            time.sleep(120)  # the test kills the process long before this ends
        return claimed

    def send_then_pause(**kwargs):
        handover = send_reminder(**kwargs)
        if handover.outcome is Outcome.DELIVERED:
            sent.append(kwargs["reminder"].pk)
            if len(sent) == int(count):
                print(f"SENT n={len(sent)} pk={sent[-1]}", flush=True)
                time.sleep(120)
        return handover

    if name == "claimed":
        reminders.claim_batch = claim_then_pause
    else:
        senders.send_reminder = send_then_pause
    execute_from_command_line(["manage.py", *command])


if __name__ == "__main__":
    main()
