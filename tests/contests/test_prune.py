"""Reminder pruning: one set-based DELETE of reminders that can no longer fire."""

from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from contests.models import Contest, Reminder
from contests.services import prune_stale_reminders
from tests.contests.reminder_data import make_contest

pytestmark = pytest.mark.django_db


def _contest(contest_id: int, *, start: timedelta, phase: str = "BEFORE", removed: bool = False) -> Contest:
    return make_contest(contest_id, start=start, phase=phase, removed_at=timezone.now() if removed else None)


@pytest.fixture
def contests():
    return {
        "upcoming": _contest(1, start=timedelta(days=1)),
        "started": _contest(2, start=timedelta(minutes=-5), phase="CODING"),
        "finished": _contest(3, start=timedelta(days=-3), phase="FINISHED"),
        "removed": _contest(4, start=timedelta(days=2), removed=True),
        # Finished by phase although its start time (as stored) is still ahead.
        "finished_early": _contest(5, start=timedelta(days=1), phase="FINISHED"),
    }


def test_reminders_of_started_finished_and_removed_contests_go(contests, django_user_model):
    users = [django_user_model.objects.create(username=f"u{i}") for i in range(3)]
    for user in users:
        for contest in contests.values():
            Reminder.objects.create(
                user=user, contest=contest, remind_at=contest.start_time - timedelta(hours=1)
            )

    assert Reminder.objects.stale(now=timezone.now()).count() == 12
    with CaptureQueriesContext(connection) as queries:
        pruned = prune_stale_reminders()

    assert pruned == 12
    assert set(Reminder.objects.values_list("contest__contest_id", flat=True)) == {1}
    assert Reminder.objects.count() == 3
    deletes = [q["sql"] for q in queries if q["sql"].upper().startswith("DELETE")]
    assert len(deletes) == 1
    assert len(queries) == 1


def test_pruning_is_one_statement_whatever_the_number_of_reminders(contests, django_user_model):
    users = django_user_model.objects.bulk_create(
        [django_user_model(username=f"user{i}") for i in range(300)]
    )
    Reminder.objects.bulk_create(
        Reminder(user=user, contest=contest, remind_at=contest.start_time)
        for user in users
        for contest in contests.values()
    )

    with CaptureQueriesContext(connection) as queries:
        pruned = prune_stale_reminders()

    assert pruned == 1200
    assert Reminder.objects.count() == 300
    assert len(queries) == 1


def test_nothing_stale_deletes_nothing(contests, django_user_model):
    user = django_user_model.objects.create(username="ann")
    Reminder.objects.create(user=user, contest=contests["upcoming"], remind_at=timezone.now())

    assert prune_stale_reminders() == 0
    assert Reminder.objects.count() == 1
