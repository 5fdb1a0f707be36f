"""The contest sync: fetch, validate, upsert by diff, mark removals, prune reminders."""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime
from hashlib import blake2b as _blake2b

from django.db import connections, router, transaction
from django.db.models import Exists, OuterRef, QuerySet
from django.db.models.functions import Now
from django.utils import timezone

from contests.codeforces import CodeforcesClient, CodeforcesError, ContestRecord
from contests.models import Contest, Platform, Reminder
from locks import Lease, fenced

logger = logging.getLogger(__name__)

SYNCED_FIELDS = ("name", "type", "phase", "frozen", "start_time", "duration")
BATCH_SIZE = 1000
# Backends whose delete() can filter through a join: Django's SQL backends.
# Others (MongoDB) take the portable form, delete_by_pk().
JOIN_DELETE_VENDORS = frozenset({"postgresql", "sqlite"})
EXISTS_DELETE_VENDORS = frozenset({"sqlite"})


@dataclass
class SyncStats:
    fetched: int = 0
    created: int = 0
    updated: int = 0
    unchanged: int = 0
    invalid: int = 0
    removed: int = 0
    pruned: int = 0

    def as_dict(self) -> dict[str, int]:
        return asdict(self)


def fingerprint(record: ContestRecord) -> str:
    start = record.start_time.isoformat() if record.start_time else ""
    # One f-string rather than a join of str() calls: the resync computes this
    # for every contest, and the text (so every stored digest) stays the same.
    text = (
        f"{record.name}\x1f{record.type}\x1f{record.phase}\x1f{record.frozen}\x1f"
        f"{start}\x1f{record.duration.total_seconds()}"
    )
    return _blake2b(text.encode(), digest_size=16).hexdigest()


def sync_codeforces_contests(
    *,
    client: CodeforcesClient,
    now: datetime | None = None,
    dry_run: bool = False,
    lease: Lease | None = None,
) -> SyncStats:
    """Bring the stored contests in line with Codeforces.

    A failed fetch or validation raises ``CodeforcesError`` before any write.
    Contest writes happen in one ``fenced(lease)`` transaction that starts by
    renewing ``lease`` (fencing: docs/architecture.md, The lock), so a process
    that lost its lease writes nothing. A resync of an unchanged list is one read and the prune: no
    contest row is written. Whether a contest has started (so its reminders are pruned, and a
    vanished one is marked removed) is judged by the database clock, not this host's; ``now``
    replaces both clocks (tests).
    """
    started = now or Now()  # a host whose clock is fast must not prune reminders still due
    now = now or timezone.now()  # what the rows record (updated_at, removed_at)
    fetched = client.contest_list()
    if lease is not None:
        # The fetch can outlast a heartbeat that failed (network cut, database
        # down): stop here, before touching the database at all.
        lease.check()
    platform = Platform.CODEFORCES
    stats = SyncStats(fetched=fetched.fetched, invalid=fetched.invalid)

    # The one read: stored keys and content fingerprints. ``removed_at`` is
    # almost always NULL, so it costs next to nothing to convert; start times
    # are only needed for contests missing from the payload, and the UPDATE
    # that marks them removed tests those in the database.
    stored = {
        contest_id: (pk, digest, removed_at)
        for pk, contest_id, digest, removed_at in Contest.objects.filter(platform=platform).values_list(
            "pk", "contest_id", "fingerprint", "removed_at"
        )
    }
    if not fetched.records and stored:
        raise CodeforcesError(
            f"Codeforces API returned no contests while {len(stored)} are stored; "
            "refusing to treat that as every contest being removed"
        )

    to_create: list[tuple[ContestRecord, str]] = []
    to_update: list[Contest] = []
    unchanged = 0
    for record in fetched.records:
        digest = fingerprint(record)
        known = stored.pop(record.contest_id, None)
        if known is None:
            to_create.append((record, digest))
        elif known[1] != digest or known[2] is not None:
            contest = _contest(record, digest, platform=platform, now=now)
            contest.pk = known[0]
            to_update.append(contest)
        else:
            unchanged += 1
    # What is left in ``stored`` is missing from the payload; the upcoming,
    # not yet removed ones among them have vanished.
    missing = [pk for pk, _digest, removed_at in stored.values() if removed_at is None]
    stats.unchanged, stats.created, stats.updated = unchanged, len(to_create), len(to_update)

    if dry_run:
        stats.removed = sum(_vanished(batch, now=started).count() for batch in _batches(missing))
        stats.pruned = Reminder.objects.stale(now=started).count()
        return stats

    if lease is not None:
        lease.check()  # the heartbeat found the lease gone: stop before writing
    if not (to_create or to_update or missing):
        # No contest to write, so nothing to fence: pruning is one idempotent
        # DELETE that is right whoever runs it. This keeps an unchanged resync
        # at one read and one delete (docs/architecture.md, The sync).
        stats.pruned = prune_stale_reminders(now=started)
        return stats
    # fenced(): the transaction starts by renewing the lease (LockLost: nothing
    # below runs) and, for a scheduled run, marks its tick done as it commits.
    with fenced(lease) if lease is not None else transaction.atomic():
        Contest.objects.bulk_create(
            [_contest(record, digest, platform=platform, now=now) for record, digest in to_create],
            batch_size=BATCH_SIZE,
        )
        Contest.objects.bulk_update(
            to_update, [*SYNCED_FIELDS, "fingerprint", "updated_at", "removed_at"], batch_size=BATCH_SIZE
        )
        stats.removed = sum(
            _vanished(batch, now=started).update(removed_at=now, updated_at=now)
            for batch in _batches(missing)
        )
        stats.pruned = prune_stale_reminders(now=started)
    return stats


def _vanished(pks: list[int], *, now: datetime | Now):
    """Those of ``pks`` that were still upcoming and announced."""
    return Contest.objects.filter(pk__in=pks, removed_at__isnull=True, start_time__gt=now)


def prune_stale_reminders(*, now: datetime | Now | None = None) -> int:
    """One set-based DELETE of reminders that can no longer fire, judged by the database
    clock (``now``: another one).

    SQL backends delete through the join to the contest in one statement.
    MongoDB cannot delete across collections, so there the stale reminders'
    keys are read first and the delete matches them (``delete_by_pk``).
    """
    stale = Reminder.objects.stale(now=now)
    vendor = connections[router.db_for_write(Reminder)].vendor
    if vendor in EXISTS_DELETE_VENDORS:
        # The same filter as a correlated EXISTS: SQLite deletes in one pass over
        # the table instead of first listing every matching id (15-20% less time
        # for 500,000 of 1,000,000 reminders, docs/benchmarks.md). PostgreSQL is
        # as fast or faster with the join.
        stale = Reminder.objects.filter(Exists(stale.filter(pk=OuterRef("pk"))))
    if vendor in JOIN_DELETE_VENDORS:
        deleted, _ = stale.delete()
        return deleted
    return delete_by_pk(stale)


def delete_by_pk(queryset: QuerySet) -> int:
    """Delete what ``queryset`` selects by reading its primary keys first: the
    portable form of a delete whose filter spans a join."""
    using = router.db_for_write(queryset.model)
    pks = list(queryset.using(using).values_list("pk", flat=True))
    deleted = 0
    for batch in _batches(pks):
        count, _ = queryset.model._base_manager.using(using).filter(pk__in=batch).delete()
        deleted += count
    return deleted


def _contest(record: ContestRecord, digest: str, *, platform: str, now: datetime) -> Contest:
    # A ContestRecord's fields are the Contest fields the sync writes. vars(), not asdict():
    # asdict() deep-copies every value, about 0.2 s more on a first load of 17,580 contests.
    return Contest(platform=platform, **vars(record), fingerprint=digest, updated_at=now, removed_at=None)


def _batches(items: list, size: int = BATCH_SIZE) -> Iterable[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
