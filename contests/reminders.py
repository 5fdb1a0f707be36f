"""Reminder delivery: due reminders claimed in batches, emailed, recorded in groups.

The steps, what a crash at each one leaves behind, and the guarantee ("at most once
automatically; at most RECORD_EVERY more per crash") are in docs/reminders.md.
"""

from __future__ import annotations

import functools
import logging
import secrets
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import asdict, dataclass, fields
from datetime import datetime, timedelta
from itertools import islice

from django.conf import settings
from django.core.mail.backends.base import BaseEmailBackend
from django.db import InterfaceError, OperationalError, connections, router
from django.db.models import Case, ExpressionWrapper, F, QuerySet, When
from django.db.models.functions import Now

from contests.mail import Handover, Outcome, reminder_message
from contests.models import Reminder
from contests.senders import Post
from contests.text import error_text
from locks import Lease, make_holder, now_plus

logger = logging.getLogger(__name__)

# Deliveries are recorded after every RECORD_EVERY messages: a SIGKILL between handing
# messages to the server and recording them sends at most this many again (docs/reminders.md).
RECORD_EVERY = 50
# Recording a group again after a database error: 0.5 s, doubling, at most 5 s between tries
# (for up to a third of SEND_REMINDERS_CLAIM_TTL, _Group.record).
RECORD_RETRY_FIRST, RECORD_RETRY_MOST = 0.5, 5.0
# Claims in a row that may come back empty, while due reminders remain, before a
# run gives up (other runs took the rows each claim picked).
CLAIM_TRIES = 5
# Which due reminders go first: the soonest contest, then the oldest reminder.
CLAIM_ORDER = ("contest__start_time", "remind_at", "pk")

NO_ADDRESS = "not sent: the user has no email address"
UNRECORDED = (
    "attempt {attempts}, the last one allowed, never recorded its outcome (its run stopped): "
    "its email may have gone out, so it is not sent again by itself"
)
GAVE_UP = "gave up: {attempts} attempts, the most SEND_REMINDERS_MAX_ATTEMPTS allows"


class ReminderDeliveryError(RuntimeError):
    """The mail server cannot be used: the run stops, what is left waits for the next one."""


@dataclass
class ReminderStats:
    due: int = 0  # reminders this run took: claimed, or settled without a message
    sent: int = 0
    failed: int = 0  # refused by the mail server this time (may be tried again)
    uncertain: int = 0  # went out, answer never came: never sent again by itself
    skipped: int = 0  # users without an email address

    def as_dict(self) -> dict[str, int]:
        return asdict(self)

    def add(self, **counts: int) -> None:
        for name, count in counts.items():
            setattr(self, name, getattr(self, name) + count)

    def describe(self) -> str:
        return " ".join(f"{field.name}={getattr(self, field.name)}" for field in fields(self))


def _claim_expiry() -> ExpressionWrapper:
    return now_plus(timedelta(seconds=settings.SEND_REMINDERS_CLAIM_TTL))


# --- claims --------------------------------------------------------------------------


def _keys(queryset: QuerySet, *, limit: int | None = None):
    """``queryset``'s primary keys for the ``pk__in`` of an UPDATE: a subquery where the
    database takes one with a LIMIT (SQLite, PostgreSQL), so the UPDATE is one statement;
    read first where it does not (MongoDB, which cannot update across collections either)."""
    keys = queryset.values_list("pk", flat=True)[:limit]
    if connections[router.db_for_write(Reminder)].features.allow_sliced_subqueries_with_in:
        return keys
    return list(keys)


def claim_batch(*, run: str, claim: str, limit: int, max_attempts: int, now: datetime | None = None) -> int:
    """Claim up to ``limit`` due reminders for ``claim`` (an id unique to this run and
    batch: ``run``, a dot, more) in one UPDATE, on the database clock; the number claimed.
    Reminders an earlier claim of the same run already took are left to later runs: a
    run tries each reminder once.

    The UPDATE's own WHERE re-checks that each row is still claimable: on PostgreSQL
    (READ COMMITTED) a concurrent run may claim the rows the subquery picked before this
    UPDATE locks them; PostgreSQL then re-evaluates that WHERE on the new row version,
    and such rows are skipped, never taken twice. A claim that comes back empty while
    due reminders remain is tried again, at most ``CLAIM_TRIES`` times.
    """
    takeable = Reminder.objects.claimable().filter(attempts__lt=max_attempts)
    due = (
        Reminder.objects.due(now=now)
        .claimable()
        .filter(attempts__lt=max_attempts)
        .exclude(claimed_by__startswith=f"{run}.")
    )
    expires = _claim_expiry()
    for _ in range(CLAIM_TRIES):
        picked = _keys(due.order_by(*CLAIM_ORDER), limit=limit)
        claimed = takeable.filter(pk__in=picked).update(claimed_until=expires, claimed_by=claim)
        if claimed or not due.exists():
            return claimed
    return 0


def claimed_reminders(*, claim: str, limit: int) -> Iterator[Reminder]:
    """The reminders of one claim (at most ``limit``), with their users and contests, in
    send order. Streamed, one fetch of ``limit`` rows: on SQLite a connection whose read
    is still open cannot write once another process has written since (SQLITE_BUSY, which
    the busy timeout does not retry), so the read must end before the batch's first
    write; one batch is all a run holds in memory."""
    return (
        Reminder.objects.filter(claimed_by=claim)
        .select_related("user", "contest")
        .annotate(db_now=Now())
        .order_by(*CLAIM_ORDER)
        .iterator(chunk_size=limit)
    )


def renew_claim(*, claim: str) -> int:
    """Extend what is left of a claim by ``SEND_REMINDERS_CLAIM_TTL`` from now; how many
    reminders it still holds (fewer than it should: another run took some, ``_Claim``)."""
    return Reminder.objects.filter(claimed_by=claim, claimed_until__isnull=False).update(
        claimed_until=_claim_expiry()
    )


def release_claim(*, claim: str, reason: str) -> int:
    """Free what is left of a claim, unsent: no attempt used; a later run sends them."""
    return Reminder.objects.filter(claimed_by=claim, claimed_until__isnull=False).update(
        claimed_until=None, last_error=reason
    )


def settle_exhausted(*, now: datetime | None = None, max_attempts: int) -> tuple[int, int]:
    """Settle due reminders that used every attempt, so that no run may claim them: one
    whose claim expired (its run died) never recorded its last attempt's outcome, so its
    email may have gone out (uncertain); the others were refused every time (failed).
    The numbers made uncertain and failed."""
    exhausted = Reminder.objects.due(now=now).claimable().filter(attempts__gte=max_attempts)
    lost = Reminder.objects.filter(pk__in=_keys(exhausted.filter(claimed_until__isnull=False)))
    uncertain = lost.update(
        uncertain_at=Now(), claimed_until=None, last_error=UNRECORDED.format(attempts=max_attempts)
    )
    refused = Reminder.objects.filter(pk__in=_keys(exhausted.filter(claimed_until__isnull=True)))
    return uncertain, refused.update(failed_at=Now(), last_error=GAVE_UP.format(attempts=max_attempts))


# --- a run ------------------------------------------------------------------------------


class _Stopped(Exception):
    """The run is stopping (SIGTERM in the main thread): each connection stops before its next message."""


class _Run:
    """What one run shares: settings, the lease, the counts."""

    def __init__(self, *, now: datetime | None, lease: Lease | None) -> None:
        self.now = now
        self.lease = lease
        # Every claim id of this run starts with it: the holder, and a suffix of its own
        # (a caller may hand the same holder to several runs).
        self.id = f"{lease.holder if lease is not None else make_holder()}/{secrets.token_hex(3)}"
        self.max_attempts = settings.SEND_REMINDERS_MAX_ATTEMPTS
        self.batch = settings.SEND_REMINDERS_BATCH
        self.renew_every = settings.SEND_REMINDERS_CLAIM_TTL / 3
        self.stats = ReminderStats()
        self.refusal = ""  # the mail server's first refusal in this run, for its error
        self.stopping = threading.Event()
        self._lock = threading.Lock()

    def check(self) -> None:
        """Raise ``LockLost`` once the lease is gone, ``_Stopped`` once the run stops."""
        if self.lease is not None:
            self.lease.check()
        if self.stopping.is_set():
            raise _Stopped("the run was stopped")

    def count(self, **counts: int) -> None:
        with self._lock:
            self.stats.add(**counts)


class _Claim:
    """One claimed batch, and which of its reminders are still this run's to send.

    A claim is renewed every third of ``SEND_REMINDERS_CLAIM_TTL`` while its batch lasts, and
    each group's start renews its own reminders' (counting their attempt, one UPDATE). Either
    UPDATE says how many it still held: fewer than it should means the claim expired meanwhile
    (the run was frozen, a SIGSTOP or a paused VM, longer than the TTL) and another run took
    them; those are dropped, never sent from memory, with one WARNING.
    """

    def __init__(self, run: _Run, claim: str, reminders: list[Reminder], *, confirmed: float) -> None:
        self.run, self.id = run, claim
        self.held = {reminder.pk for reminder in reminders}  # claimed, neither recorded nor lost
        self.lost: set = set()
        self.confirmed = confirmed  # time.monotonic() when the database last extended it all
        self._lock = threading.Lock()

    def holds(self, pk) -> bool:
        """Whether ``pk`` is still this run's to send; renews the claim first once a third of
        its TTL has passed since it was last extended (also right after the run was frozen)."""
        with self._lock:
            if time.monotonic() - self.confirmed >= self.run.renew_every:
                started = time.monotonic()
                renewed = renew_claim(claim=self.id)
                self.confirmed = started
                if renewed < len(self.held):
                    self._lose(
                        self.held, Reminder.objects.filter(claimed_by=self.id, claimed_until__isnull=False)
                    )
            return pk not in self.lost

    def start(self, pks: list) -> list:
        """Count an attempt for each of ``pks`` that is still this claim's and extend their
        claims (one UPDATE); the ones that are."""
        mine = Reminder.objects.filter(pk__in=pks, claimed_by=self.id, claimed_until__isnull=False)
        counted = mine.update(attempts=F("attempts") + 1, claimed_until=_claim_expiry())
        if counted < len(pks):
            with self._lock:
                self._lose(self.held & set(pks), mine)
        return [pk for pk in pks if pk not in self.lost]

    def _lose(self, expected: set, still_mine: QuerySet) -> None:
        """Drop what of ``expected`` is not in ``still_mine`` (read now), with one WARNING."""
        lost = expected - set(still_mine.values_list("pk", flat=True))
        if lost:
            self.lost |= lost
            self.held -= lost
            logger.warning(
                "claim=%s %d of its reminders are no longer its own (its claim expired while this run was "
                "stopped or slow, and another run took them, or they were deleted): dropped, not sent",
                self.id,
                len(lost),
            )

    def recorded(self, pks: Iterable) -> None:
        with self._lock:
            self.held -= set(pks)


class _Group:
    """Up to ``RECORD_EVERY`` reminders of one claim: marked as tried, sent, then recorded
    together (one UPDATE for every delivery)."""

    def __init__(self, run: _Run, claim: _Claim, reminders: list[Reminder]) -> None:
        self.run, self.claim = run, claim
        self.pks = [r.pk for r in reminders]
        self.skipped = [r.pk for r in reminders if not r.user.email]
        addressed = [r for r in reminders if r.user.email]
        # An attempt is counted as it starts: a crash before the record leaves it counted.
        self.extended = time.monotonic()  # its claims were last extended here or later (claim.confirmed)
        started = set(claim.start([r.pk for r in addressed])) if addressed else set()
        self.to_send = [r for r in addressed if r.pk in started]
        # pk -> (outcome, error), one assignment per message: a signal cannot leave half of one.
        self.outcomes: dict = {}

    def messages(self, message_for) -> Iterator[tuple[Reminder, object]]:
        """Each reminder to send with its message (``message_for(reminder)``: the message, or
        why it cannot be built, a bad address: refused without a word to the server)."""
        for reminder in self.to_send:
            message = message_for(reminder)
            if isinstance(message, str):
                self.done(reminder, Handover(Outcome.REFUSED, message))
                continue
            yield reminder, message

    def done(self, reminder: Reminder, handover: Handover) -> None:
        """What became of ``reminder``'s email; the first word on it stands. An unsent one
        stays untried: its attempt is given back."""
        attempt = f"attempt {reminder.attempts + 1}"
        if handover.outcome is Outcome.REFUSED:
            error = f"{attempt}: {handover.error}"
            self.run.refusal = self.run.refusal or handover.error
        elif handover.outcome is Outcome.UNCERTAIN:
            error = (
                f"{attempt}: outcome unknown, the message went out but the mail server's answer never "
                f"came ({handover.error}); it may have been delivered, so it is not sent again by itself"
            )
        elif handover.outcome is Outcome.UNSENT:
            return
        else:
            error = ""
        self.outcomes.setdefault(reminder.pk, (handover.outcome, error))

    def record(self, *, unsent_reason: str) -> None:
        """What went out is recorded whoever holds the reminder now (only a claim that
        expired mid-group lets another run take it); the rest only while it is this claim's.

        A database error (a restart, a failover) is retried, each step from where it stopped,
        until a third of ``SEND_REMINDERS_CLAIM_TTL`` after its claims were last extended, not after
        the record began (issue 26: the writes before it may have waited, for a synchronous standby
        away): its claims stay this run's meanwhile, so no other run sends again what this one
        sent. Each step can be run twice (its first COMMIT's answer lost) to the same end.
        """
        found = {outcome: [] for outcome in Outcome}
        for pk, (outcome, error) in dict(self.outcomes).items():
            found[outcome].append((pk, error))
        steps = self._steps(found, unsent_reason=unsent_reason)
        deadline = max(self.extended, self.claim.confirmed) + settings.SEND_REMINDERS_CLAIM_TTL / 3
        pause = RECORD_RETRY_FIRST
        while steps:
            try:
                steps[0]()
            except (OperationalError, InterfaceError) as exc:
                if time.monotonic() + pause > deadline:
                    raise
                logger.warning(
                    "claim=%s could not record its group (%s); trying again in %.1f s",
                    self.claim.id,
                    error_text(exc),
                    pause,
                )
                connections[router.db_for_write(Reminder)].close_if_unusable_or_obsolete()
                time.sleep(pause)
                pause = min(2 * pause, RECORD_RETRY_MOST)
                continue
            steps.pop(0)
        self.claim.recorded(self.pks)
        self.run.count(
            sent=len(found[Outcome.DELIVERED]),
            failed=len(found[Outcome.REFUSED]),
            uncertain=len(found[Outcome.UNCERTAIN]),
            skipped=len(self.skipped),
        )

    def _steps(self, found: dict, *, unsent_reason: str) -> list:
        undelivered = Reminder.objects.filter(delivered_at__isnull=True)
        # Still claimed by this group: a step run again after its COMMIT changes nothing more.
        mine = undelivered.filter(claimed_by=self.claim.id, claimed_until__isnull=False)
        steps = []
        if found[Outcome.DELIVERED]:
            delivered = [pk for pk, _ in found[Outcome.DELIVERED]]

            def record_delivered():
                recorded = undelivered.filter(pk__in=delivered).update(delivered_at=Now(), claimed_until=None)
                if recorded < len(delivered):
                    logger.warning(
                        "claim=%s %d of its %d delivered reminders were recorded as delivered by another "
                        "run (its claim had expired): they went out twice",
                        self.claim.id,
                        len(delivered) - recorded,
                        len(delivered),
                    )

            steps.append(record_delivered)

        def record_uncertain():
            for pk, error in found[Outcome.UNCERTAIN]:
                undelivered.filter(pk=pk).update(claimed_until=None, last_error=error, uncertain_at=Now())

        def record_refused():
            for pk, error in found[Outcome.REFUSED]:
                # The try that reaches SEND_REMINDERS_MAX_ATTEMPTS gives it up.
                given_up = Case(When(attempts__gte=self.run.max_attempts, then=Now()), default=None)
                mine.filter(pk=pk).update(claimed_until=None, last_error=error, failed_at=given_up)

        steps += [record_uncertain, record_refused]
        if self.skipped:
            steps.append(
                lambda: mine.filter(pk__in=self.skipped).update(
                    claimed_until=None, last_error=NO_ADDRESS, failed_at=Now()
                )
            )
        untried = [r.pk for r in self.to_send if r.pk not in self.outcomes]
        if untried:
            steps.append(
                lambda: mine.filter(pk__in=untried).update(
                    claimed_until=None, last_error=unsent_reason, attempts=F("attempts") - 1
                )
            )
        return steps


def _deliver_batches(run: _Run, post: Post) -> None:
    """Claim batch after batch and send it, until nothing due is left or every connection failed."""
    batch = 0
    while not post.failed:
        run.check()
        batch += 1
        claim = f"{run.id}.{batch}"
        started = time.monotonic()
        claimed = claim_batch(
            run=run.id, claim=claim, limit=run.batch, max_attempts=run.max_attempts, now=run.now
        )
        if not claimed:
            return
        run.count(due=claimed)
        _deliver(run, post, claim, started=started)


def _deliver(run: _Run, post: Post, claim_id: str, *, started: float) -> None:
    """Send one claimed batch, group by group. However it ends, what it did not send is
    released with no attempt used, unless a group's record was cut short: then its claims
    stay, to expire (as after a crash)."""
    reminders = list(claimed_reminders(claim=claim_id, limit=run.batch))
    claim = _Claim(run, claim_id, reminders, confirmed=started)
    if len(post.connections) == 1:
        # One connection: the whole batch built in one go before its first message is sent
        # (built between sends, while the core has just run the mail server and the database,
        # a message takes half as long again). Several: each built as a connection is free for
        # it, so that building overlaps their waits for the server.
        message_for = _build(reminders, post.build).pop
    else:
        message_for = functools.partial(_build_one, build=post.build)
    group, unrecorded, finished = None, None, False
    reason = "not sent yet: the run stopped before sending it"
    try:
        for chunk in _chunks(reminders, RECORD_EVERY):
            group = _Group(run, claim, chunk)
            post.send(group, group.messages(message_for))
            if post.failed:
                reason = post.unsent_reason()
            unrecorded, group = group, None
            unrecorded.record(unsent_reason=reason)
            unrecorded = None
            if post.failed:
                return
        finished = True
    except BaseException as exc:
        reason = f"not sent yet: the run stopped: {error_text(exc)}"
        raise
    finally:
        if group is not None:
            group.record(unsent_reason=reason)
        if not finished and unrecorded is None:
            release_claim(claim=claim_id, reason=reason)


def _build_one(reminder: Reminder, *, build):
    """``reminder``'s message as the connections send it (``build``), or why it cannot be
    built (``ValueError``: a bad address)."""
    try:
        return build(reminder_message(reminder=reminder, now=reminder.db_now))
    except ValueError as exc:
        return error_text(exc)


def _build(reminders: list[Reminder], build) -> dict:
    """Each message of a batch (``_build_one``), by the reminder: the ones with an address."""
    return {reminder: _build_one(reminder, build=build) for reminder in reminders if reminder.user.email}


def _chunks(items: Iterable, size: int) -> Iterator[list]:
    iterator = iter(items)
    while chunk := list(islice(iterator, size)):
        yield chunk


def deliver_due_reminders(
    *,
    now: datetime | None = None,
    connection: BaseEmailBackend | None = None,
    lease: Lease | None = None,
    dry_run: bool = False,
) -> ReminderStats:
    """Send every due reminder that no other run has claimed, each at most once.

    Claims up to ``SEND_REMINDERS_BATCH`` due reminders at a time with one UPDATE, builds
    their messages and hands them, group by group (``RECORD_EVERY``), to
    ``SEND_REMINDERS_CONNECTIONS`` mail server connections (contests/senders.py), recording
    each group once it is sent, until nothing due is left: reminders that fall due meanwhile
    are claimed by the same run. A connection opens with its first message: with nothing due,
    no mail server is asked. ``connection`` (a backend) replaces them with that one.
    ``now`` (default: the database clock) decides what is due. Raises
    ``ReminderDeliveryError`` when the mail server cannot be reached or every connection
    failed (the unsent reminders are released with no attempt used), or refused every message
    the run tried (each refusal recorded, its attempt used), ``LockLost`` when
    ``lease`` is lost (checked before each message).
    """
    due = Reminder.objects.due(now=now).claimable()
    if dry_run:
        return ReminderStats(due=due.count(), skipped=due.filter(user__email="").count())
    run = _Run(now=now, lease=lease)
    uncertain, failed = settle_exhausted(now=now, max_attempts=run.max_attempts)
    run.count(due=uncertain + failed, uncertain=uncertain, failed=failed)
    post = Post(
        run, count=1 if connection is not None else settings.SEND_REMINDERS_CONNECTIONS, backend=connection
    )
    try:
        _deliver_batches(run, post)
    finally:
        post.close()
    failures = post.errors
    if not failures:
        # Refused every message it tried (expired credentials: 550 to all): a failed run, not a quiet one.
        if run.stats.failed > failed and not (run.stats.sent or run.stats.uncertain > uncertain):
            raise ReminderDeliveryError(
                f"the mail server refused every message of this run ({run.refusal}); {run.stats.describe()}; "
                "each refusal is recorded on its reminder, tried again by a later run up to SEND_REMINDERS_MAX_ATTEMPTS"
            )
        return run.stats
    if all(failure.unreachable for failure in failures) and not any(
        connection.connected for connection in post.connections
    ):
        error = f"not sent yet: {failures[0].error}"
        waiting = Reminder.objects.filter(pk__in=_keys(due)).update(last_error=error)
        raise ReminderDeliveryError(
            f"{error}; {waiting} due reminders wait for the next run, no attempt used"
        )
    errors = "; ".join(f"connection {failure.number}: {failure.error}" for failure in failures)
    raise ReminderDeliveryError(
        f"{errors}; {run.stats.describe()}; its unsent reminders wait for the next run, no attempt used"
    )


def retry_reminders(*, reminders) -> int:
    """Make failed or uncertain, undelivered reminders pending again (the admin's retry
    action): an uncertain one may then be emailed a second time."""
    return (
        reminders.filter(delivered_at__isnull=True)
        .exclude(failed_at__isnull=True, uncertain_at__isnull=True)
        .update(failed_at=None, uncertain_at=None, attempts=0, claimed_until=None)
    )
