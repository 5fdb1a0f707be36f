"""Contests, users and reminders written straight into the test database."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.utils import timezone

from contests.models import Contest, Reminder


def make_contest(contest_id: int, *, start: timedelta | None, **fields) -> Contest:
    """A contest starting ``start`` from now (negative: it has started)."""
    now = timezone.now()
    values = {
        "name": f"Codeforces Round {contest_id} (Div. 2)",
        "type": "CF",
        "phase": "BEFORE" if start and start > timedelta(0) else "CODING",
        "start_time": now + start if start is not None else None,
        "duration": timedelta(hours=2),
        "fingerprint": "0" * 32,
        "updated_at": now,
        **fields,
    }
    return Contest.objects.create(contest_id=contest_id, **values)


def make_user(name: str, *, email: str | None = None):
    address = f"{name}@example.com" if email is None else email
    return get_user_model().objects.create_user(name, email=address)


def make_reminder(user, contest: Contest, *, at: timedelta, **fields) -> Reminder:
    """A reminder for ``at`` from now (negative: its time has come)."""
    return Reminder.objects.create(user=user, contest=contest, remind_at=timezone.now() + at, **fields)


def due_reminders(count: int, *, contest: Contest, prefix: str = "user") -> list[Reminder]:
    """``count`` due reminders, one per user with an email address."""
    return [
        make_reminder(make_user(f"{prefix}{n}"), contest, at=-timedelta(minutes=1 + n % 5))
        for n in range(count)
    ]


def many_due_reminders(count: int, *, contest: Contest, prefix: str = "bulk") -> list[int]:
    """``count`` due reminders for as many new users (``{prefix}{n}@example.com``), written
    with two bulk inserts; their primary keys."""
    user_model = get_user_model()
    users = user_model.objects.bulk_create(
        user_model(username=f"{prefix}{n}", email=f"{prefix}{n}@example.com", password="!")
        for n in range(count)
    )
    if users and users[0].pk is None:  # a backend that does not return keys from bulk inserts
        users = list(user_model.objects.filter(username__startswith=prefix).order_by("pk"))
    remind_at = timezone.now() - timedelta(minutes=1)
    Reminder.objects.bulk_create(Reminder(user=user, contest=contest, remind_at=remind_at) for user in users)
    mine = Reminder.objects.filter(contest=contest, user__username__startswith=prefix)
    return list(mine.values_list("pk", flat=True))
