"""The soak's reminders part (``--reminders``): what it seeds, how the replicas reach the SMTP
stand-in, and its checks.

The driver starts the stand-in (``tests/smtp_standin.py``, loopback, a ``REPLY_DELAY`` before
each 250) for the whole soak and gives the replicas ``EMAIL_URL`` pointing at it with the
settings below; ``seed`` writes two contests and reminders due evenly through the soak; the
replicas run ``send_reminders`` beside the soak job. Afterwards the stand-in's messages are
matched to the ``Reminder`` rows by recipient and subject (``contests.mail.reminder_message``:
the user's address, the contest's name and start), and ``judge`` (pure, tested on made-up
histories in tests/soak/test_checker.py) says:

- ``reminder-once``: no reminder reached the stand-in twice, except re-sends the documented
  window allows (docs/reminders.md, "Unknown is not failed", its guarantee: a SIGKILL between
  handing messages to the server and recording them re-sends at most ``RECORD_EVERY`` per crash). Each re-send must come
  after a SIGKILL of a replica whose ``send_reminders`` run died with it (its run never ended by
  itself: ``running``, or ``abandoned`` by the next holder) and after the copy before it, and
  no such kill is charged more than ``RECORD_EVERY`` re-sends. With no such kill, none at all.
- ``uncertain-not-resent``: a message whose reply the stand-in lost (kept, no 250) leaves its
  reminder ``uncertain`` (or still under the claim of a run that died waiting for that reply),
  and no reminder got a copy after such a message or after being recorded uncertain, other than
  a re-send charged to a kill as above.
- ``reminders-delivered``: every reminder due by the last healthy slot ended delivered (with a
  copy at the stand-in), uncertain, or failed (refused ``SEND_REMINDERS_MAX_ATTEMPTS`` times:
  the stand-in refuses none, so none is expected); none is left pending past its chance. A
  reminder still claimed by a run killed by the nemesis, its claim (``REMINDER_CLAIM_TTL``)
  running past the last slot, is not due again yet: counted as *waiting*, not lost.
"""

from __future__ import annotations

import time
from collections import defaultdict
from dataclasses import dataclass
from datetime import datetime, timedelta
from itertools import pairwise

from tests.soak import timing
from tests.soak.checker import Check, listed, plural

# The stand-in timestamps a message once its last byte is read, a moment after the client
# sent it: a copy up to this long after a SIGKILL may still come from the killed run.
KILL_TOLERANCE = 1.0
UNFINISHED = frozenset({"running", "abandoned"})  # a run that died before recording its end
DELIVERED, UNCERTAIN, FAILED, PENDING = "delivered", "uncertain", "failed", "pending"
CONTEST_IDS = (917001, 917002)


@dataclass(frozen=True)
class ReminderRow:
    pk: int
    key: tuple[str, str]  # (recipient, subject): what identifies its email
    remind_at: datetime
    state: str  # DELIVERED, UNCERTAIN, FAILED or PENDING
    claimed_until: datetime | None = None
    claimed_by: str = ""


@dataclass(frozen=True)
class Copy:
    """One message the stand-in received in full."""

    key: tuple[str, str]
    at: float  # time.time()
    answered: bool  # its 250 was sent; false: the reply was lost (withheld or dropped)


@dataclass(frozen=True)
class Kill:
    """A SIGKILL of a replica, with every process of its group then (its runs' children too)."""

    replica: str
    at: float  # time.time()
    pids: frozenset[int]


def holder_pid(holder: str) -> int | None:
    """The pid in a holder (``host:pid:suffix``) or a claim id (a holder, ``/``, more)."""
    parts = holder.split(":")
    return int(parts[1]) if len(parts) > 2 and parts[1].isdigit() else None


def replica_env(*, port: int) -> dict[str, str]:
    """The replicas' reminder settings: the stand-in's address and the soak's clock."""
    return {
        "EMAIL_URL": f"smtp://127.0.0.1:{port}",
        "EMAIL_TIMEOUT": str(timing.EMAIL_TIMEOUT),
        "SEND_REMINDERS_SCHEDULE": timing.SCHEDULE,
        "SEND_REMINDERS_LOCK_TTL": str(timing.TTL),
        "SEND_REMINDERS_MAX_RUN_TIME": str(timing.MAX_RUN_TIME),
        "SEND_REMINDERS_CLAIM_TTL": str(timing.REMINDER_CLAIM_TTL),
    }


def seed(*, start: float, end: float) -> int:
    """Reminders due evenly from ``start`` to ``end`` (``time.time()``), ``REMINDERS_PER_MINUTE``
    of them a minute, for two contests starting hours later; two per user (one per contest),
    so that only the subject tells a user's two emails apart. The number written."""
    from django.db import transaction

    from tests.contests.reminder_data import make_contest, make_reminder, make_user

    count = max(2, round((end - start) * timing.REMINDERS_PER_MINUTE / 60))
    with transaction.atomic():
        contests = [
            make_contest(contest_id, start=timedelta(hours=3 + index))
            for index, contest_id in enumerate(CONTEST_IDS)
        ]
        user = None
        for number in range(count):
            if number % 2 == 0:
                user = make_user(f"soak{number // 2}")
            due = start + (end - start) * number / count
            make_reminder(user, contests[number % 2], at=timedelta(seconds=due - time.time()))
    return count


def _subject(text: str) -> str:
    return " ".join(str(text).split())  # a folded header's line breaks are not part of it


def load(arrivals) -> tuple[list[ReminderRow], list[Copy], list[tuple[str, str]]]:
    """The ``Reminder`` rows, the stand-in's ``arrivals`` as copies, and ``send_reminders``'
    runs (holder, status), from the database the ORM is connected to."""
    from contests.mail import reminder_message
    from contests.models import Reminder
    from locks.models import JobRun

    rows = []
    for reminder in Reminder.objects.select_related("user", "contest").order_by("pk"):
        if reminder.delivered_at is not None:
            state = DELIVERED
        elif reminder.uncertain_at is not None:
            state = UNCERTAIN
        elif reminder.failed_at is not None:
            state = FAILED
        else:
            state = PENDING
        key = (reminder.user.email, _subject(reminder_message(reminder=reminder).subject))
        rows.append(
            ReminderRow(
                reminder.pk, key, reminder.remind_at, state, reminder.claimed_until, reminder.claimed_by
            )
        )
    copies = [
        Copy((arrival.recipient, _subject(arrival.message["Subject"])), arrival.at, arrival.answered)
        for arrival in arrivals
    ]
    runs = list(JobRun.objects.for_job(timing.REMINDERS_JOB).values_list("holder", "status"))
    return rows, copies, runs


def judge(
    *,
    reminders: list[ReminderRow],
    copies: list[Copy],
    runs: list[tuple[str, str]],
    kills: list[Kill],
    last: datetime,
    origin: float,
    record_every: int,
    failovers: tuple[float, ...] = (),
) -> tuple[list[Check], dict]:
    """The reminder checks, and the numbers of the record's reminders table. ``runs``:
    ``send_reminders``' runs as (holder, status); ``last``: the last healthy slot;
    ``origin``: the first slot's ``time.time()`` (details say seconds after it);
    ``failovers``: when each failover killed the primary (``--failover``): a re-send no kill
    explains whose copies a failover came between is set aside (the table's ``failover_resends``)
    for the failover checks (``tests.soak.failover``, ``emails-across-failovers``) to judge."""
    dead_runs = {holder_pid(holder) for holder, status in runs if status in UNFINISHED}
    crashes = sorted((kill for kill in kills if kill.pids & dead_runs), key=lambda kill: kill.at)
    killed = set().union(*(kill.pids for kill in kills))
    row_of = {row.key: row for row in reminders}
    copies_of: dict[tuple[str, str], list[Copy]] = defaultdict(list)
    for copy in sorted(copies, key=lambda copy: copy.at):
        copies_of[copy.key].append(copy)
    strangers = sorted(key for key in copies_of if key not in row_of)

    def at(moment: float) -> str:
        return f"+{moment - origin:.1f}s"

    # Each re-send is charged to the earliest kill of a reminder holder between the copy
    # before it (less KILL_TOLERANCE) and itself that has not used its RECORD_EVERY.
    charged: dict[int, int] = defaultdict(int)
    explained, unexplained, across = [], [], []  # (row key, the copy before, the re-send)
    for key, found in copies_of.items():
        for before, again in pairwise(found):
            kill = next(
                (
                    index
                    for index, kill in enumerate(crashes)
                    if before.at - KILL_TOLERANCE <= kill.at <= again.at and charged[index] < record_every
                ),
                None,
            )
            if kill is None and any(before.at < moment < again.at for moment in failovers):
                across.append((key, before, again))
            elif kill is None:
                unexplained.append((key, before, again))
            else:
                charged[kill] += 1
                explained.append((key, before, again))
    allowed = record_every * len(crashes)
    bound = (
        f"allowed: at most {record_every} (RECORD_EVERY) per SIGKILL of a replica whose send_reminders run "
        f"died with it, {plural(len(crashes), 'such kill')}, so at most {allowed}, each after its kill"
    )

    def show(item) -> str:
        key, before, again = item
        return f"{key[0]} ({key[1]}) at {at(before.at)} and again at {at(again.at)}"

    once_bad = unexplained or strangers
    once = Check(
        "reminder-once",
        not once_bad,
        listed(
            f"{plural(len(unexplained), 're-send')} no SIGKILL of a reminder holder explains"
            + (f", {plural(len(strangers), 'message')} matching no reminder" if strangers else ""),
            [show(item) for item in unexplained] + [f"{key[0]} ({key[1]})" for key in strangers],
        )
        + f"; {bound}"
        if once_bad
        else f"{len(copies)} messages for {len(copies_of)} reminders; "
        f"{plural(len(explained), 're-send')}; {bound}",
    )

    lost_reply = {key for key, found in copies_of.items() if any(not copy.answered for copy in found)}
    not_uncertain = [
        row
        for row in reminders
        if row.key in lost_reply
        and not copies_of[row.key][-1].answered
        and row.state != UNCERTAIN
        and not (row.state == PENDING and holder_pid(row.claimed_by) in killed)
    ]
    resent_after = [
        item
        for item in unexplained
        if not item[1].answered or (item[0] in row_of and row_of[item[0]].state == UNCERTAIN)
    ]
    uncertain_rows = [row for row in reminders if row.state == UNCERTAIN]
    lost_copies = sum(not copy.answered for copy in copies)
    uncertain_bad = not_uncertain or resent_after
    uncertain = Check(
        "uncertain-not-resent",
        not uncertain_bad,
        listed(
            f"{plural(len(not_uncertain), 'reminder')} whose last message's reply was lost not recorded "
            f"uncertain, {plural(len(resent_after), 're-send')} after a lost reply or of an uncertain reminder",
            [f"{row.key[0]} ({row.key[1]}) is {row.state}" for row in not_uncertain]
            + [show(item) for item in resent_after],
        )
        if uncertain_bad
        else f"{plural(lost_copies, 'message')} kept without a 250 (lost replies), "
        f"{plural(len(uncertain_rows), 'reminder')} uncertain, "
        f"{sum(len(copies_of[row.key]) > 1 for row in uncertain_rows)} of them with more than one copy "
        f"(each re-send charged to a kill in reminder-once); none re-sent by itself",
    )

    judged = [row for row in reminders if row.remind_at <= last]
    waiting = [
        row
        for row in judged
        if row.state == PENDING
        and row.claimed_until is not None
        and row.claimed_until > last
        and holder_pid(row.claimed_by) in killed
    ]
    lost = [row for row in judged if row.state == PENDING and row not in waiting]
    phantom = [row for row in judged if row.state == DELIVERED and not copies_of[row.key]]
    count = {state: sum(row.state == state for row in judged) for state in (DELIVERED, UNCERTAIN, FAILED)}
    delivered = Check(
        "reminders-delivered",
        not lost and not phantom,
        listed(
            f"{plural(len(lost), 'reminder')} left pending past its chance, "
            f"{plural(len(phantom), 'reminder')} recorded delivered with no copy at the stand-in",
            [f"#{row.pk} {row.key[0]} due {row.remind_at:%H:%M:%S}: {row.state}" for row in lost + phantom],
        )
        if lost or phantom
        else f"all {len(judged)} reminders due by the last slot settled: {count[DELIVERED]} delivered, "
        f"{count[UNCERTAIN]} uncertain, {count[FAILED]} failed; {len(waiting)} waiting out the claim "
        f"of a killed run (not due again before the end)",
    )
    table = {
        "seeded": len(reminders),
        "run_kills": len(crashes),
        "judged": len(judged),
        **count,
        "waiting": len(waiting),
        "lost": len(lost),
        "copies": len(copies),
        "resent": len(explained) + len(unexplained) + len(across),
        "charged": len(explained),
        "allowed": allowed,
        "lost_replies": lost_copies,
    }
    if failovers:
        table["failover_resends"] = [
            {"key": list(key), "before": before.at, "again": again.at} for key, before, again in across
        ]
    return [once, uncertain, delivered], table
