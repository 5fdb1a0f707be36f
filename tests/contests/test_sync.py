"""The sync service: upsert by diff, removals, abort rules, fencing."""

import re
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from contests.codeforces import CodeforcesClient, CodeforcesError
from contests.models import Contest, Reminder
from contests.services import sync_codeforces_contests
from locks import api
from tests.contests.conftest import shift_to_now, upcoming_ids

pytestmark = pytest.mark.django_db


def sync(**kwargs):
    return sync_codeforces_contests(client=CodeforcesClient(), **kwargs)


WRITE = re.compile(r'^\s*(INSERT INTO|UPDATE|DELETE FROM) "?contests_contest"?\s', re.IGNORECASE)


def _writes(queries) -> list[str]:
    """Statements that write the contest table itself."""
    return [q["sql"] for q in queries if WRITE.match(q["sql"])]


def test_first_sync_stores_every_contest(standin):
    stats = sync()

    assert stats.as_dict() == {
        "fetched": 1758,
        "created": 1758,
        "updated": 0,
        "unchanged": 0,
        "invalid": 0,
        "removed": 0,
        "pruned": 0,
    }
    assert Contest.objects.count() == 1758
    contest = Contest.objects.get(contest_id=1844)
    assert contest.name == "Codeforces Round  884 (Div. 1 + Div. 2)"
    assert (contest.platform, contest.type, contest.phase, contest.duration) == (
        "codeforces",
        "CF",
        "FINISHED",
        timedelta(hours=3),
    )


def test_a_second_sync_of_the_same_payload_writes_no_contest_row(standin):
    sync()
    before = dict(Contest.objects.values_list("contest_id", "updated_at"))

    with CaptureQueriesContext(connection) as queries:
        stats = sync()

    assert (stats.created, stats.updated, stats.unchanged) == (0, 0, 1758)
    assert _writes(queries) == []
    assert dict(Contest.objects.values_list("contest_id", "updated_at")) == before


def test_a_changed_name_updates_exactly_that_row(standin, payload):
    standin.set_payload(payload)
    sync()
    before = dict(Contest.objects.values_list("contest_id", "updated_at"))
    payload["result"][5]["name"] = "Renamed Round"
    changed_id = payload["result"][5]["id"]
    standin.set_payload(payload)

    with CaptureQueriesContext(connection) as queries:
        stats = sync()

    assert (stats.created, stats.updated, stats.unchanged) == (0, 1, 1757)
    assert len(_writes(queries)) == 1
    assert Contest.objects.get(contest_id=changed_id).name == "Renamed Round"
    after = dict(Contest.objects.values_list("contest_id", "updated_at"))
    assert [cid for cid in after if after[cid] != before[cid]] == [changed_id]


def test_a_new_contest_is_created_and_the_rest_left_alone(standin, payload):
    standin.set_payload(payload)
    sync()
    payload["result"].insert(0, {**payload["result"][0], "id": 9999, "name": "Brand new"})
    standin.set_payload(payload)

    stats = sync()

    assert (stats.created, stats.updated, stats.unchanged) == (1, 0, 1758)
    assert Contest.objects.get(contest_id=9999).name == "Brand new"


def test_an_upcoming_contest_that_vanishes_is_marked_removed_and_can_return(standin, payload):
    shift_to_now(payload)
    upcoming = upcoming_ids(payload)
    assert len(upcoming) == 2
    standin.set_payload(payload)
    sync()
    gone = upcoming[0]
    standin.set_payload({**payload, "result": [c for c in payload["result"] if c["id"] != gone]})

    stats = sync()

    assert stats.removed == 1
    assert list(Contest.objects.removed().values_list("contest_id", flat=True)) == [gone]
    assert Contest.objects.upcoming().count() == 1
    # A finished contest missing from the answer is history, not a removal.
    assert Contest.objects.filter(phase="FINISHED", removed_at__isnull=False).count() == 0

    standin.set_payload(payload)
    stats = sync()
    assert (stats.updated, stats.removed) == (1, 0)
    assert not Contest.objects.removed().exists()


def test_an_empty_list_while_contests_are_known_aborts(standin):
    sync()
    standin.set_payload({"status": "OK", "result": []})

    with pytest.raises(CodeforcesError, match="returned no contests while 1758 are stored"):
        sync()
    assert Contest.objects.count() == 1758
    assert not Contest.objects.removed().exists()


def test_an_empty_list_on_an_empty_database_is_fine(standin):
    standin.set_payload({"status": "OK", "result": []})
    assert sync().fetched == 0


def test_dry_run_counts_and_writes_nothing(standin, payload, django_user_model):
    shift_to_now(payload)
    standin.set_payload(payload)

    stats = sync(dry_run=True)

    assert (stats.fetched, stats.created) == (1758, 1758)
    assert Contest.objects.count() == 0


def test_a_stale_lease_writes_nothing(standin):
    lease = api.acquire(job="sync_contests", tick=None, ttl=timedelta(minutes=5))
    api.force_release(job="sync_contests", by="test")  # someone took over

    with pytest.raises(api.LockLost):
        sync(lease=lease)
    assert Contest.objects.count() == 0


def test_a_live_lease_is_renewed_inside_the_write_transaction(standin):
    lease = api.acquire(job="sync_contests", tick=None, ttl=timedelta(minutes=5))

    with CaptureQueriesContext(connection) as queries:
        sync(lease=lease)

    sqls = [q["sql"] for q in queries]
    renew = next(i for i, sql in enumerate(sqls) if sql.startswith("UPDATE") and "locks_synclock" in sql)
    first_insert = next(
        i for i, sql in enumerate(sqls) if sql.startswith("INSERT") and "contests_contest" in sql
    )
    assert renew < first_insert
    assert Contest.objects.count() == 1758


def test_sync_prunes_stale_reminders(standin, payload, django_user_model):
    shift_to_now(payload)
    standin.set_payload(payload)
    sync()
    user = django_user_model.objects.create(username="ann")
    upcoming = Contest.objects.upcoming().first()
    finished = Contest.objects.filter(phase="FINISHED").first()
    Reminder.objects.create(user=user, contest=upcoming, remind_at=upcoming.start_time - timedelta(hours=1))
    Reminder.objects.create(user=user, contest=finished, remind_at=timezone.now())

    stats = sync()

    assert stats.pruned == 1
    assert list(Reminder.objects.values_list("contest_id", flat=True)) == [upcoming.pk]
