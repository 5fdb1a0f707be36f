"""The contest sync: fetch, validate, upsert by diff, mark removals, prune reminders."""

from __future__ import annotations

import hashlib
import logging
from collections.abc import Iterable
from dataclasses import asdict, dataclass
from datetime import datetime

from django.db import connections, router, transaction
from django.db.models import QuerySet
from django.utils import timezone

from contests.codeforces import CodeforcesClient, CodeforcesError, ContestRecord
from contests.models import Contest, Platform, Reminder
from locks.api import Lease

logger = logging.getLogger(__name__)

SYNCED_FIELDS = ("name", "type", "phase", "frozen", "start_time", "duration")
BATCH_SIZE = 1000
# Backends whose delete() can filter through a join: Django's SQL backends.
# Others (MongoDB) take the portable form, delete_by_pk().
JOIN_DELETE_VENDORS = frozenset({"postgresql", "sqlite", "mysql", "oracle"})


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
    text = "\x1f".join(
        (
            record.name,
            record.type,
            record.phase,
            str(record.frozen),
            start,
            str(record.duration.total_seconds()),
        )
    )
    return hashlib.blake2b(text.encode(), digest_size=16).hexdigest()


def sync_codeforces_contests(
    *,
    client: CodeforcesClient,
    now: datetime | None = None,
    dry_run: bool = False,
    lease: Lease | None = None,
) -> SyncStats:
    """Bring the stored contests in line with Codeforces.

    A failed fetch or validation raises ``CodeforcesError`` before any write.
    All writes happen in one transaction that starts by renewing ``lease``
    (fencing, DESIGN lock semantic 6), so a process that lost its lease writes
    nothing.
    """
    now = now or timezone.now()
    fetched = client.contest_list()
    if lease is not None:
        # The fetch can outlast a heartbeat that failed (network cut, database
        # down): stop here, before touching the database at all.
        lease.check()
    platform = Platform.CODEFORCES
    stats = SyncStats(fetched=fetched.fetched, invalid=fetched.invalid)

    # The one read: stored keys, content fingerprints and what removal needs.
    stored = {
        contest_id: (pk, digest, start_time, removed_at)
        for pk, contest_id, digest, start_time, removed_at in Contest.objects.filter(
            platform=platform
        ).values_list("pk", "contest_id", "fingerprint", "start_time", "removed_at")
    }
    if not fetched.records and stored:
        raise CodeforcesError(
            f"Codeforces API returned no contests while {len(stored)} are stored; "
            "refusing to treat that as every contest being removed"
        )

    to_create: list[Contest] = []
    to_update: list[Contest] = []
    for record in fetched.records:
        digest = fingerprint(record)
        known = stored.get(record.contest_id)
        if known is None:
            to_create.append(_contest(record, digest, platform=platform, now=now))
        elif known[1] != digest or known[3] is not None:
            contest = _contest(record, digest, platform=platform, now=now)
            contest.pk = known[0]
            to_update.append(contest)
        else:
            stats.unchanged += 1
    seen = {record.contest_id for record in fetched.records}
    vanished = [
        pk
        for contest_id, (pk, _digest, start_time, removed_at) in stored.items()
        if contest_id not in seen and removed_at is None and start_time is not None and start_time > now
    ]
    stats.created, stats.updated, stats.removed = len(to_create), len(to_update), len(vanished)

    if dry_run:
        stats.pruned = Reminder.objects.stale(now=now).count()
        return stats

    with transaction.atomic():
        if lease is not None:
            lease.check()
            lease.renew()  # raises LockLost: nothing below runs
        Contest.objects.bulk_create(to_create, batch_size=BATCH_SIZE)
        Contest.objects.bulk_update(
            to_update, [*SYNCED_FIELDS, "fingerprint", "updated_at", "removed_at"], batch_size=BATCH_SIZE
        )
        for batch in _batches(vanished):
            Contest.objects.filter(pk__in=batch).update(removed_at=now, updated_at=now)
        stats.pruned = prune_stale_reminders(now=now)
    return stats


def prune_stale_reminders(*, now: datetime | None = None) -> int:
    """One set-based DELETE of reminders that can no longer fire.

    SQL backends delete through the join to the contest in one statement.
    MongoDB cannot delete across collections, so there the stale reminders'
    keys are read first and the delete matches them (``delete_by_pk``).
    """
    stale = Reminder.objects.stale(now=now or timezone.now())
    if connections[router.db_for_write(Reminder)].vendor in JOIN_DELETE_VENDORS:
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
    return Contest(
        platform=platform,
        contest_id=record.contest_id,
        name=record.name,
        type=record.type,
        phase=record.phase,
        frozen=record.frozen,
        start_time=record.start_time,
        duration=record.duration,
        fingerprint=digest,
        first_seen_at=now,
        updated_at=now,
        removed_at=None,
    )


def _batches(items: list, size: int = BATCH_SIZE) -> Iterable[list]:
    for start in range(0, len(items), size):
        yield items[start : start + size]
