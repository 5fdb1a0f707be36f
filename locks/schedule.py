"""Cron expressions to ticks: the scheduled slot a run belongs to.

Cron expressions are read in UTC, whatever ``TIME_ZONE`` is: croniter is fed
aware UTC datetimes, iterates in UTC and returns aware UTC slots. UTC has no
repeated or missing hour, so on a DST night every slot is distinct and real
(docs/architecture.md, "Which slot a run claims").
"""

from datetime import UTC, datetime, timedelta

from croniter import CroniterBadDateError, croniter


def is_valid_expression(expression: str) -> bool:
    return isinstance(expression, str) and croniter.is_valid(expression)


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{moment.isoformat()} has no time zone: slots are instants, give an aware datetime")
    return moment.astimezone(UTC)


def _prev(expression: str, moment: datetime) -> datetime:
    # croniter marks some results fold=1; UTC has no fold, so drop it.
    return croniter(expression, moment).get_prev(datetime).replace(fold=0)


def _next(expression: str, moment: datetime) -> datetime:
    return croniter(expression, moment).get_next(datetime).replace(fold=0)


def slot_at_or_before(expression: str, *, now: datetime) -> datetime:
    """The latest slot at or before ``now`` (``now`` itself when it is a slot)."""
    now = _utc(now)
    earlier = _prev(expression, now)  # strictly before now
    following = _next(expression, earlier)
    return following if following <= now else earlier


def slot_before(expression: str, *, moment: datetime) -> datetime:
    """The latest slot strictly before ``moment``."""
    return _prev(expression, _utc(moment))


def next_tick(expression: str, *, now: datetime) -> datetime:
    """The first slot strictly after ``now``."""
    return _next(expression, _utc(now))


def is_slot(expression: str, moment: datetime) -> bool:
    return slot_at_or_before(expression, now=moment) == _utc(moment)


def previous_slots(expression: str, *, now: datetime, count: int) -> list[datetime]:
    """The ``count`` latest slots at or before ``now``, newest first."""
    slots = [slot_at_or_before(expression, now=now)]
    while len(slots) < count:
        slots.append(slot_before(expression, moment=slots[-1]))
    return slots


def period(expression: str, *, now: datetime) -> timedelta:
    """The gap around ``now``: from the latest slot at or before it to the next one.

    An hour for ``0 * * * *``; for ``0 8,9 * * *`` an hour at 08:30 and 23 hours
    at 10:00. Never zero: the next slot is after ``now``, the latest not.
    """
    return next_tick(expression, now=now) - slot_at_or_before(expression, now=now)


def early_window(expression: str, *, now: datetime, window: timedelta) -> timedelta:
    """How early a run at ``now`` may claim the upcoming slot: ``window``, capped at a
    quarter of the gap around ``now``."""
    return min(window, period(expression, now=now) / 4)


def current_tick(expression: str, *, now: datetime, window: timedelta) -> datetime:
    """The slot a run at ``now`` claims.

    The upcoming slot if it is at most ``window`` away, the window capped at a
    quarter of the gap around ``now`` (so a host a few minutes fast names the slot
    its peers name); otherwise the latest slot at or before ``now`` (so a late or
    manual run claims the slot it follows, and catches it up if nobody ran it).
    """
    upcoming = next_tick(expression, now=now)
    if upcoming - _utc(now) <= early_window(expression, now=now, window=window):
        return upcoming
    return slot_at_or_before(expression, now=now)


def pending_slot(
    expression: str, *, claimed: datetime, settled: bool, due: datetime, oldest: datetime
) -> datetime:
    """Under catch_up "all", the slot a run up to ``due`` claims, given the tick ``claimed``
    last: that one again while it is not ``settled`` (done, or out of attempts) and not older
    than ``oldest`` (the catch-up window's start); else the slot after it, or the first at or
    after ``oldest``. ``due`` itself when that lies beyond ``due`` (the lease then says why
    there is nothing to run)."""
    if not settled and claimed >= oldest:
        return min(claimed, due)
    following = next_tick(expression, now=claimed)
    first = oldest if is_slot(expression, oldest) else next_tick(expression, now=oldest)
    return min(max(following, first), due)


class InvalidTick(ValueError):
    """A tick that is no slot of the schedule, or too far ahead of the database clock."""


def check_tick(expression: str, tick: datetime) -> datetime:
    """``tick`` in UTC, if it is a slot of ``expression``; else ``InvalidTick`` naming
    the nearest slots. How far ahead a tick may lie is the lease's compare-and-set to
    judge, on the database clock (``tick_ahead_message`` says why it refused)."""
    try:
        utc = _utc(tick)
        if is_slot(expression, utc):
            return utc
        before = slot_at_or_before(expression, now=utc)
        after = next_tick(expression, now=utc)
    except (OverflowError, CroniterBadDateError):
        # Near year 1 or 9999 the slot before or after lies outside what datetime holds.
        raise InvalidTick(
            f"tick {tick.isoformat()} is out of the range the schedule {expression!r} can be computed in "
            "(a slot before and after it must lie within the years 1 to 9999)"
        ) from None
    raise InvalidTick(
        f"tick {utc.isoformat()} is not a slot of the schedule {expression!r} (UTC); "
        f"the nearest valid slots are {before.isoformat()} and {after.isoformat()}"
    )


def tick_ahead_message(
    expression: str,
    tick: datetime,
    *,
    db_now: datetime,
    horizon: timedelta,
    window: timedelta,
    bound: str = "one schedule period",
) -> str:
    """Why ``tick`` was refused as more than ``horizon`` (``bound``) ahead of the database
    clock (``db_now``), with the slots a run may name instead."""
    latest = slot_at_or_before(expression, now=db_now + horizon)
    claimed = current_tick(expression, now=db_now, window=window)
    return (
        f"tick {_utc(tick).isoformat()} is more than {bound} ({horizon}) ahead of the "
        f"database clock ({db_now.isoformat(timespec='seconds')}); the latest slot it may name "
        f"is {latest.isoformat()}, the one a run claims now is {claimed.isoformat()}"
    )
