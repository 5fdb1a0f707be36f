"""The sync service: upsert by diff, removals, abort rules, fencing."""

import re
import time
from datetime import timedelta

import pytest
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from contests.codeforces import MAX_CONTEST_ID, CodeforcesClient, CodeforcesError
from contests.models import Contest, Reminder
from contests.services import sync_codeforces_contests
from locks.lease import LockLost, acquire
from locks.models import JobRun, SyncLock
from locks.operator import force_release
from tests.conftest import manage, project_env
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
    lease = acquire(job="sync_contests", tick=None, ttl=timedelta(minutes=5))
    force_release(job="sync_contests", by="test")  # someone took over

    with pytest.raises(LockLost):
        sync(lease=lease)
    assert Contest.objects.count() == 0


def test_a_live_lease_is_renewed_inside_the_write_transaction(standin):
    lease = acquire(job="sync_contests", tick=None, ttl=timedelta(minutes=5))

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


# --- entries the database cannot store (issue 12, item 6) ------------------------

POISON = {
    "id 2**31 (PostgreSQL integer out of range)": {"id": 2**31},
    "id 2**63 (SQLite OverflowError)": {"id": 2**63},
    "duration 10**20 s (timedelta OverflowError)": {"durationSeconds": 10**20},
    "start time out of datetime range": {"startTimeSeconds": 10**20},
    "NUL in the name (PostgreSQL)": {"name": "Round\x00 1"},
    "NUL in the type (PostgreSQL)": {"type": "C\x00F"},
    "unpaired surrogate in the name (UnicodeEncodeError)": {"name": "Round \ud800"},
}


@pytest.mark.parametrize("poison", list(POISON))
def test_an_entry_the_database_cannot_store_is_counted_and_the_rest_synced(standin, payload, poison):
    entry = {**payload["result"][0], "id": 5_000_000, "name": "Poisoned", **POISON[poison]}
    payload["result"].insert(3, entry)
    standin.set_payload(payload)

    stats = sync()

    assert (stats.fetched, stats.created, stats.invalid) == (1759, 1758, 1)
    assert Contest.objects.count() == 1758
    assert not Contest.objects.filter(contest_id=entry["id"]).exists()
    assert not Contest.objects.filter(name__startswith="Poisoned").exists()
    # Next hour, the same answer: still synced, still one invalid entry.
    assert (sync().unchanged, Contest.objects.count()) == (1758, 1758)


def test_the_largest_accepted_id_fits_the_column_on_this_database(standin, payload):
    internal_type = Contest._meta.get_field("contest_id").get_internal_type()
    low, high = connection.ops.integer_field_range(internal_type)
    assert low <= 1 and high >= MAX_CONTEST_ID
    if connection.vendor == "postgresql":
        assert high == MAX_CONTEST_ID  # the bound is exactly the column's
    payload["result"].append({**payload["result"][0], "id": MAX_CONTEST_ID, "name": "Largest"})
    standin.set_payload(payload)

    assert sync().created == 1759
    assert Contest.objects.get(contest_id=MAX_CONTEST_ID).name == "Largest"


# --- the total deadline (CODEFORCES_TOTAL_TIMEOUT) --------------------------------


@pytest.mark.slow
@pytest.mark.django_db(transaction=True)
def test_a_trickled_answer_fails_the_run_at_the_deadline_and_releases_the_lease(db_url, standin):
    standin.trickle, standin.trickle_for = 0.2, 60  # one byte per 0.2 s, never a read timeout
    env = project_env(DATABASE_URL=db_url, CODEFORCES_API_URL=standin.url, CODEFORCES_TOTAL_TIMEOUT="1.5")

    started = time.monotonic()
    proc = manage("sync_contests", "--tick", "2026-11-30T14:00:00+00:00", env=env)

    assert time.monotonic() - started < 45  # ended by the deadline, not by the stand-in's 60 s bound
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr + proc.stdout
    [error] = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert "job=sync_contests" in error and "outcome=failed" in error
    assert "did not answer within 1.5 s (total deadline CODEFORCES_TOTAL_TIMEOUT)" in error
    assert standin.trickled >= 2 and standin.calls == 1
    assert not Contest.objects.exists()
    lock = SyncLock.objects.get()
    assert (lock.locked_until, lock.last_status) == (None, "failed")
    assert JobRun.objects.get().status == "failed"
