"""Cron expressions to ticks: a ``Schedule`` reads its fields in its time zone (default UTC); every slot
is an aware UTC instant; a DST night follows Vixie cron's rule (docs/jobs.md, "Time zones and DST").
Pure: no database."""

import threading
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta, tzinfo
from functools import lru_cache
from importlib import resources
from zoneinfo import ZoneInfo, ZoneInfoNotFoundError

from croniter import CroniterBadDateError, croniter

DEFAULT_TIMEZONE = "UTC"
GAP, REPEAT = "gap", "repeat"  # where the DST rule applied to a slot (``dst_rule``)
_SECOND = timedelta(seconds=1)
_TINY = timedelta(microseconds=1)
# One croniter per expression and thread, moved to each start: building one expands its
# fields, most of the cost of a step (`locks next --count 1000` of `* * * * *`: about 110 ms without, 30 ms with).
_ITERATORS = threading.local()


def is_valid_expression(expression: str) -> bool:
    return isinstance(expression, str) and croniter.is_valid(expression)


def is_valid_timezone(name) -> bool:
    """Whether ``name`` is an IANA zone the pinned tzdata package knows."""
    if not isinstance(name, str) or not name:
        return False
    try:
        zone(name)
    except (ZoneInfoNotFoundError, ValueError, OSError):  # OSError: a directory such as "Europe"
        return False
    return True


def zone(tz: "str | tzinfo") -> tzinfo:
    """``tz`` as a tzinfo: an IANA name from the pinned tzdata package, a tzinfo as it is."""
    return _tzdata(tz) if isinstance(tz, str) else tz


@lru_cache(maxsize=256)
def _tzdata(name: str) -> ZoneInfo:
    """The zone ``name`` of the pinned ``tzdata`` package, never this host's own zone files (which
    ``ZoneInfo`` reads first): every host runs a local slot at the same instant (docs/jobs.md)."""
    parts = name.split("/")
    if any(part in {"", ".", ".."} for part in parts):
        raise ValueError(f"{name!r} is not an IANA zone name")
    try:
        with resources.files("tzdata").joinpath("zoneinfo", *parts).open("rb") as data:
            return ZoneInfo.from_file(data, key=name)
    except FileNotFoundError:
        raise ZoneInfoNotFoundError(f"No time zone found with key {name}") from None


def _is_utc(tz: tzinfo) -> bool:
    return tz is UTC or getattr(tz, "key", None) in {"UTC", "Etc/UTC"}


def _cron(expression: str, start: datetime) -> croniter:
    iterators = _ITERATORS.__dict__.setdefault("by_expression", {})
    iterator = iterators.get(expression)
    if iterator is None:
        if len(iterators) >= 256:
            iterators.clear()
        iterator = iterators[expression] = croniter(expression, start)
    else:
        iterator.set_current(start, force=True)
    return iterator


def _utc(moment: datetime) -> datetime:
    if moment.tzinfo is None or moment.utcoffset() is None:
        raise ValueError(f"{moment.isoformat()} has no time zone: slots are instants, give an aware datetime")
    return moment.astimezone(UTC)


# --- the DST rule: wall times of a zone to slots --------------------------------------
#
# Wall times are naive datetimes in the zone; croniter iterates over them as a calendar
# without clocks changing. Each matching wall time is then one, two or no instants. Around
# a repeat [A, B) the instants come in this order: the walls before A, the first
# occurrences of [A, B), the second occurrences of [A, B), the walls from B on.


@lru_cache(maxsize=256)
def fixed_time(expression: str) -> bool:
    """Whether the minute and hour fields are both fixed (``30 2``, ``0,30 1-5``): Vixie cron's
    fixed-time job. A field that starts with ``*`` (``*``, ``*/15``) makes it a wildcard job, and of
    croniter's nicknames (``@daily``: ``0 0 * * *``) only ``@hourly`` (``0 * * * *``) is one."""
    if expression.startswith("@"):
        return expression.lower() != "@hourly"
    fields = expression.split()
    return len(fields) > 1 and not fields[0].startswith("*") and not fields[1].startswith("*")


def _wall(moment: datetime, tz: tzinfo) -> datetime:
    return moment.astimezone(tz).replace(tzinfo=None, fold=0)


def _instants(wall: datetime, tz: tzinfo) -> tuple[datetime, datetime]:
    """``wall`` read at its first and its second occurrence (PEP 495 fold), in UTC: equal for
    an ordinary wall time, first < second in a repeat, first > second in a gap."""
    return (wall.replace(tzinfo=tz, fold=0).astimezone(UTC), wall.replace(tzinfo=tz, fold=1).astimezone(UTC))


def _transition(tz: tzinfo, before: datetime, after: datetime) -> datetime:
    """The instant the zone's offset changes, in (``before``, ``after``]: the first instant
    with the offset of ``after`` (offsets change on whole seconds)."""
    offset = after.astimezone(tz).utcoffset()
    low, high = int(before.timestamp()), int(after.timestamp())  # low: old offset, high: new
    while high - low > 1:
        middle = (low + high) // 2
        if datetime.fromtimestamp(middle, UTC).astimezone(tz).utcoffset() == offset:
            high = middle
        else:
            low = middle
    return datetime.fromtimestamp(high, UTC)


def _walls_around(tz: tzinfo, change: datetime) -> tuple[datetime, datetime]:
    """The wall times on each side of the change at ``change``: the end of the wall clock
    before it, and its start after it. A gap is [before, after); a repeat is [after, before)."""
    return _wall(change - _SECOND, tz) + _SECOND, _wall(change, tz)


def _zoned(expression: str, tz: tzinfo, moment: datetime, *, forward: bool) -> datetime:
    """The first slot after ``moment``, or the latest before it, under the DST rule."""
    moment = moment.astimezone(UTC)
    local = moment.astimezone(tz)
    wall, named = local.replace(tzinfo=None, fold=0), fixed_time(expression)
    ahead = moment.__lt__ if forward else moment.__gt__  # ahead(x): x lies beyond ``moment``

    def cron(start: datetime) -> datetime:  # the matching wall after (or before) ``start``
        iterator = _cron(expression, start)
        return (iterator.get_next if forward else iterator.get_prev)(datetime)

    candidate = cron(wall)
    first, second = _instants(wall, tz)
    if first < second and local.fold == (0 if forward else 1):
        # ``moment`` is in a repeat [start, end), in its first pass (forward: once its matching walls
        # are used up, the first comes again, second time round) or its second (backward: before it
        # lie the second occurrences of the walls before its own, then every first occurrence).
        start, end = _walls_around(tz, _transition(tz, first, second))[::-1]
        if forward and not named and candidate >= end:
            again = cron(start - _TINY)
            if again < end:
                return again.replace(tzinfo=tz, fold=1).astimezone(UTC)
        elif not forward:
            if not named and candidate >= start:
                return candidate.replace(tzinfo=tz, fold=1).astimezone(UTC)
            candidate = cron(end)
            if candidate >= start:
                return candidate.replace(tzinfo=tz, fold=0).astimezone(UTC)
    while True:
        first, second = _instants(candidate, tz)
        if first > second:  # a gap: named, the first instant after it; wildcard, nothing
            change = _transition(tz, second, first)
            if named and ahead(change):
                return change
            before, after = _walls_around(tz, change)
            candidate = cron(after - _TINY if forward else before)
            continue
        # An ordinary wall's one instant; a repeat's first occurrence, under a wildcard both.
        for instant in (first, second) if forward else (second, first):
            if ahead(instant) and (instant == first or not named):
                return instant
        candidate = cron(candidate)


def local_time(moment: datetime, *, tz: "str | tzinfo" = DEFAULT_TIMEZONE) -> datetime:
    """``moment`` on the wall clock of ``tz`` (aware, with its offset)."""
    return _utc(moment).astimezone(zone(tz))


def local_label(moment: datetime, *, tz: "str | tzinfo" = DEFAULT_TIMEZONE) -> str:
    """``2027-03-28 03:00 CEST``: ``moment`` as people read it, in ``tz`` with its abbreviation."""
    local = local_time(moment, tz=tz)
    return f"{local.date().isoformat()} {local:%H:%M} {local:%Z}"


@dataclass(frozen=True)
class Upcoming:
    """A slot to come: its UTC instant, its wall clock in the job's zone and its DST mark (``dst_rule``)."""

    slot: datetime
    local: datetime
    dst: str | None

    def as_json(self) -> dict:
        return {"slot": self.slot.isoformat(), "local": self.local.isoformat(), "dst": self.dst}


class OutOfRange(ValueError):
    """Slots asked for beyond the years a datetime holds."""


class InvalidTick(ValueError):
    """A tick that is no slot of the schedule, or too far ahead of the database clock."""


@dataclass(frozen=True)
class Schedule:
    """A cron expression read in a time zone (an IANA name or a tzinfo); its slots are aware UTC instants."""

    expression: str
    timezone: "str | tzinfo" = DEFAULT_TIMEZONE

    def _step(self, moment: datetime, *, forward: bool) -> datetime:
        """The first slot strictly after ``moment`` (aware UTC), or the latest strictly before it."""
        tz = zone(self.timezone)
        if not _is_utc(tz):
            return _zoned(self.expression, tz, moment, forward=forward)
        iterator = _cron(self.expression, moment)
        # croniter marks some results fold=1; UTC has no fold, so drop it.
        return (iterator.get_next if forward else iterator.get_prev)(datetime).replace(fold=0)

    def slot_at_or_before(self, now: datetime) -> datetime:
        """The latest slot at or before ``now`` (``now`` itself when it is a slot)."""
        now = _utc(now)
        earlier = self._step(now, forward=False)  # strictly before now
        following = self._step(earlier, forward=True)
        return following if following <= now else earlier

    def slot_before(self, moment: datetime) -> datetime:
        """The latest slot strictly before ``moment``."""
        return self._step(_utc(moment), forward=False)

    def next_slot(self, after: datetime) -> datetime:
        """The first slot strictly after ``after``."""
        return self._step(_utc(after), forward=True)

    def is_slot(self, moment: datetime) -> bool:
        return self.slot_at_or_before(moment) == _utc(moment)

    def previous(self, now: datetime, count: int) -> list[datetime]:
        """The ``count`` latest slots at or before ``now``, newest first."""
        slots = [self.slot_at_or_before(now)]
        while len(slots) < count:
            slots.append(self.slot_before(slots[-1]))
        return slots

    def upcoming(self, after: datetime, count: int) -> list[datetime]:
        """The ``count`` first slots strictly after ``after``, oldest first."""
        slots, moment = [], _utc(after)
        for _ in range(count):
            moment = self._step(moment, forward=True)
            slots.append(moment)
        return slots

    def period(self, now: datetime) -> timedelta:
        """The gap around ``now``: from the latest slot at or before it to the next one. An hour
        for ``0 * * * *``; for ``0 8,9 * * *`` an hour at 08:30 and 23 hours at 10:00."""
        return self.next_slot(now) - self.slot_at_or_before(now)

    def current(self, now: datetime, *, window: timedelta) -> datetime:
        """The slot a run at ``now`` claims: the upcoming one if at most ``window`` (capped at a quarter
        of the gap around ``now``) away, else the latest at or before ``now`` (docs/architecture.md)."""
        upcoming, latest = self.next_slot(now), self.slot_at_or_before(now)
        return upcoming if upcoming - _utc(now) <= min(window, (upcoming - latest) / 4) else latest

    def early_window_before(self, tick: datetime, *, window: timedelta) -> timedelta:
        """How far ahead of the database clock a run may claim ``tick``: ``window``, capped at a quarter
        of the gap before it, whatever the gap after it (the last slot of a burst is a day from the next)."""
        return min(window, (_utc(tick) - self.slot_before(tick)) / 4)

    def pending(self, *, claimed: datetime, settled: bool, due: datetime, oldest: datetime) -> datetime:
        """Under catch_up "all", the slot a run up to ``due`` claims after ``claimed``: that one again
        while not ``settled`` and not older than ``oldest`` (the window's start), else the next one
        at or after ``oldest``; at most ``due``."""
        if not settled and claimed >= oldest:
            return min(claimed, due)
        first = oldest if self.is_slot(oldest) else self.next_slot(oldest)
        return min(max(self.next_slot(claimed), first), due)

    def check(self, tick: datetime) -> datetime:
        """``tick`` in UTC, if it is a slot; else ``InvalidTick`` naming the nearest slots (how far
        ahead it may lie, the lease judges: ``tick_ahead_message``)."""
        try:
            utc = _utc(tick)
            if self.is_slot(utc):
                return utc
            before, after = self.slot_at_or_before(utc), self.next_slot(utc)
        except (OverflowError, CroniterBadDateError):  # near year 1 or 9999: beyond what a datetime holds
            raise InvalidTick(
                f"tick {tick.isoformat()} is out of the range the schedule {self.expression!r} can be computed "
                "in (a slot before and after it must lie within the years 1 to 9999)"
            ) from None
        raise InvalidTick(
            f"tick {utc.isoformat()} is not a slot of the schedule {self.expression!r} "
            f"({zone_name(self.timezone)}); the nearest valid slots are {before.isoformat()} and {after.isoformat()}"
        )

    def tick_ahead_message(
        self, tick: datetime, *, db_now: datetime, horizon: timedelta, window: timedelta
    ) -> str:
        """Why ``tick`` was refused as more than ``horizon`` (the tick window) ahead of the database
        clock (``db_now``), with the slots a run may name instead."""
        latest, claimed = self.slot_at_or_before(db_now + horizon), self.current(db_now, window=window)
        return (
            f"tick {_utc(tick).isoformat()} is more than the tick window ({horizon}) ahead of the "
            f"database clock ({db_now.isoformat(timespec='seconds')}); the latest slot it may name "
            f"is {latest.isoformat()}, the one a run claims now is {claimed.isoformat()}"
        )

    def dst_rule(self, slot: datetime) -> str | None:
        """Where the DST rule made ``slot``: ``GAP``, after a spring-forward gap in place of a wall
        time that did not exist; ``REPEAT``, a wall time that occurred twice; else None."""
        tz = zone(self.timezone)
        if _is_utc(tz):
            return None
        wall = _wall(slot, tz)
        first, second = _instants(wall, tz)
        if first < second:
            return REPEAT
        moved = _cron(self.expression, wall - _TINY).get_next(datetime) != wall  # no matching wall time
        return GAP if moved else None

    def preview(self, after: datetime, count: int) -> list[Upcoming]:
        """The ``count`` slots after ``after``, each with its wall time and DST mark (``locks next``).
        Raises ``OutOfRange`` when they would lie beyond what a datetime holds (year 9999)."""
        try:
            return [
                Upcoming(slot, local_time(slot, tz=self.timezone), self.dst_rule(slot))
                for slot in self.upcoming(after, count)
            ]
        except (OverflowError, CroniterBadDateError):
            raise OutOfRange(
                f"the {count} slots of {self.expression!r} after {_utc(after).isoformat()} do not all lie "
                "within the years 1 to 9999"
            ) from None


def zone_name(tz: "str | tzinfo") -> str:
    """The name a message shows for ``tz``: its IANA key, or ``UTC``."""
    if isinstance(tz, str):
        return tz
    return "UTC" if _is_utc(tz) else getattr(tz, "key", str(tz))
