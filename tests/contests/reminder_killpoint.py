"""``manage.py`` with a pause at one step of the reminders' delivery.

    python -m tests.contests.reminder_killpoint claimed send_reminders --force
    python -m tests.contests.reminder_killpoint sent:120 send_reminders --force
    python -m tests.contests.reminder_killpoint started:2 send_reminders --force
    python -m tests.contests.reminder_killpoint recorded:1 send_reminders --force

``claimed``: the first batch is claimed (for real, in the database), then the process
prints ``CLAIMED n=<reminders> claim=<id>`` and sleeps before sending any of it.
``sent:K``: the K-th email is handed to the mail server (for real, through the
configured backend), then the process prints ``SENT n=K pk=<its reminder>`` and sleeps
before anything else, so the group it belongs to is not recorded. Either way a test can
SIGKILL it right there: only the moment is made deterministic.

``started:K`` and ``recorded:K`` freeze the process instead (it sends itself SIGSTOP, as a
paused VM or a debugger would stop it): right after the K-th group started (its attempts
counted, its claims extended) and before its first message, or right after the K-th group's
record; it prints ``STARTED n=K claim=<id>`` or ``RECORDED n=K claim=<id>`` first. A test
sends SIGCONT when it likes.
"""

from __future__ import annotations

import os
import signal
import sys
import time

POINTS = {"claimed", "sent", "started", "recorded"}


def main() -> None:
    point, *command = sys.argv[1:]
    name, _, count = point.partition(":")
    if name not in POINTS or (name != "claimed") != count.isdigit():
        raise SystemExit(
            f"kill point must be 'claimed', 'sent:K', 'started:K' or 'recorded:K', not {point!r}"
        )
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

    groups = {"started": 0, "recorded": 0}

    def freeze(step: str, claim: str) -> None:
        groups[step] += 1
        if step == name and groups[step] == int(count):
            print(f"{step.upper()} n={groups[step]} claim={claim}", flush=True)
            os.kill(os.getpid(), signal.SIGSTOP)

    class Group(reminders._Group):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            freeze("started", self.claim.id)

        def record(self, *args, **kwargs):
            super().record(*args, **kwargs)
            freeze("recorded", self.claim.id)

    if name == "claimed":
        reminders.claim_batch = claim_then_pause
    elif name == "sent":
        senders.send_reminder = send_then_pause
    else:
        reminders._Group = Group
    execute_from_command_line(["manage.py", *command])


if __name__ == "__main__":
    main()
