"""What the sync costs the database, in counts that do not depend on the clock
(docs/architecture.md, The sync; the timings are in docs/benchmarks.md, made by ``make bench``).

These run with real transactions (``transaction=True``) so that the statements
counted are the ones production sends: BEGIN, not a test's SAVEPOINTs.
"""

import math
import re
from datetime import timedelta

import pytest
from django.db import connection
from django.db.models import Max, Min
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from contests.codeforces import CodeforcesClient
from contests.models import Contest, Reminder
from contests.services import BATCH_SIZE, prune_stale_reminders, sync_codeforces_contests
from locks.lease import Lease, acquire
from tests.contests.conftest import shift_to_now, upcoming_ids

pytestmark = pytest.mark.django_db(transaction=True)

CONTESTS = 1758
TRANSACTION_CONTROL = {"BEGIN", "COMMIT", "SAVEPOINT", "RELEASE", "ROLLBACK"}
# Django's debug log writes an executemany() as "N times: SQL".
VERB = re.compile(r"^(?:\d+ times: )?\s*(\w+)")
TABLE = re.compile(
    r'^(?:\d+ times: )?\s*(?:INSERT INTO|UPDATE|DELETE FROM|SELECT .*? FROM)\s+"?(\w+)"?', re.S
)


def sync(**kwargs):
    return sync_codeforces_contests(client=CodeforcesClient(), **kwargs)


def statements(queries) -> list[tuple[str, str]]:
    """(verb, table) of each statement, in order; table is '' for BEGIN and the like."""
    out = []
    for query in queries:
        sql = query["sql"]
        table = TABLE.match(sql)
        out.append((VERB.match(sql).group(1).upper(), table.group(1) if table else ""))
    return out


def stored_rows() -> list[tuple]:
    """Every synced column exactly as the database stores it (raw, so that a
    difference in how a value is encoded shows), in contest id order."""
    with connection.cursor() as cursor:
        cursor.execute(
            "SELECT platform, contest_id, name, type, phase, frozen, start_time, duration, fingerprint, "
            "updated_at, removed_at FROM contests_contest ORDER BY contest_id"
        )
        return cursor.fetchall()


def test_a_resync_of_the_unchanged_list_is_at_most_four_queries_and_writes_no_contest_row(standin):
    first = sync()
    assert first.created == CONTESTS
    lease = acquire(job="sync_contests", tick=None, ttl=timedelta(minutes=5))
    assert isinstance(lease, Lease)
    before = stored_rows()
    changes_before = connection.connection.total_changes if connection.vendor == "sqlite" else None

    with CaptureQueriesContext(connection) as queries:
        stats = sync(lease=lease)

    assert (stats.fetched, stats.unchanged, stats.created, stats.updated, stats.removed) == (
        CONTESTS,
        CONTESTS,
        0,
        0,
        0,
    )
    # Counted as assertNumQueries counts them, BEGIN and COMMIT included: one
    # read of the contests and one prune (with nothing to write there is
    # nothing to fence, so no lease renewal).
    assert len(queries) <= 4, [q["sql"] for q in queries]
    assert statements(queries) == [
        ("SELECT", "contests_contest"),
        ("BEGIN", ""),
        ("DELETE", "contests_reminder"),
        ("COMMIT", ""),
    ]
    assert stored_rows() == before
    if changes_before is not None:
        # SQLite counts every row any statement changed, whatever the table.
        assert connection.connection.total_changes - changes_before == 0


def test_a_first_load_is_batched_inserts_and_a_resync_then_finds_every_row_unchanged(standin):
    started = timezone.now()
    with CaptureQueriesContext(connection) as first:
        assert sync().created == CONTESTS

    # first_seen_at is auto_now_add: the time of the insert.
    first_seen = Contest.objects.aggregate(earliest=Min("first_seen_at"), latest=Max("first_seen_at"))
    assert started <= first_seen["earliest"] <= first_seen["latest"] <= timezone.now()
    inserts = [s for s in statements(first) if s == ("INSERT", "contests_contest")]
    batch = min(
        BATCH_SIZE, connection.ops.bulk_batch_size(Contest._meta.concrete_fields[1:], [None] * CONTESTS)
    )
    # bulk_create in batches: a few multi-row INSERTs, not one per contest.
    assert len(inserts) == math.ceil(CONTESTS / batch)

    with CaptureQueriesContext(connection) as queries:
        stats = sync()

    assert (stats.unchanged, stats.updated) == (CONTESTS, 0)
    assert not [s for s in statements(queries) if s[1] == "contests_contest" and s[0] != "SELECT"]


def test_vanished_contests_are_marked_in_one_conditional_update(standin, payload):
    shift_to_now(payload)
    upcoming = upcoming_ids(payload)
    standin.set_payload(payload)
    sync()
    finished = next(c["id"] for c in payload["result"] if c["phase"] == "FINISHED")
    missing = {*upcoming, finished}
    standin.set_payload({**payload, "result": [c for c in payload["result"] if c["id"] not in missing]})

    preview = sync(dry_run=True)
    assert preview.removed == len(upcoming)
    assert not Contest.objects.removed().exists()

    with CaptureQueriesContext(connection) as queries:
        stats = sync()

    assert stats.removed == len(upcoming) == 2
    assert set(Contest.objects.removed().values_list("contest_id", flat=True)) == set(upcoming)
    # The finished contest missing from the answer is history, not a removal.
    assert Contest.objects.get(contest_id=finished).removed_at is None
    assert [s for s in statements(queries) if s[1] == "contests_contest"] == [
        ("SELECT", "contests_contest"),
        ("UPDATE", "contests_contest"),
    ]

    # Missing again: already removed, so nothing more is written.
    with CaptureQueriesContext(connection) as queries:
        assert sync().removed == 0
    assert [s for s in statements(queries) if s[1] == "contests_contest" and s[0] != "SELECT"] == [
        ("UPDATE", "contests_contest")  # the finished one is still missing: tested, not changed
    ]
    assert Contest.objects.get(contest_id=finished).removed_at is None

    standin.set_payload(payload)
    back = sync()
    assert (back.updated, back.removed) == (2, 0)
    assert not Contest.objects.removed().exists()


def test_pruning_is_one_delete(django_user_model):
    now = timezone.now()
    users = [django_user_model.objects.create(username=f"user{index}") for index in range(3)]
    contests = {
        "finished": Contest(contest_id=1, phase="FINISHED", start_time=now - timedelta(days=2)),
        "started": Contest(contest_id=2, phase="CODING", start_time=now - timedelta(minutes=1)),
        "removed": Contest(contest_id=3, phase="BEFORE", start_time=now + timedelta(days=1), removed_at=now),
        "upcoming": Contest(contest_id=4, phase="BEFORE", start_time=now + timedelta(days=1)),
    }
    for contest in contests.values():
        contest.name, contest.type, contest.duration, contest.updated_at = (
            "Round",
            "CF",
            timedelta(hours=2),
            now,
        )
        contest.save()
    Reminder.objects.bulk_create(
        Reminder(user=user, contest=contest, remind_at=contest.start_time - timedelta(hours=1))
        for user in users
        for contest in contests.values()
    )

    with CaptureQueriesContext(connection) as queries:
        pruned = prune_stale_reminders(now=now)

    assert pruned == 9
    assert set(Reminder.objects.values_list("contest__contest_id", flat=True)) == {4}
    # One set-based DELETE: no SELECT of the rows first, no per-row delete;
    # only Django's transaction around it besides (BEGIN, COMMIT).
    data = [s for s in statements(queries) if s[0] not in TRANSACTION_CONTROL]
    assert data == [("DELETE", "contests_reminder")], [q["sql"] for q in queries]
    assert len(queries) - len(data) <= 2
