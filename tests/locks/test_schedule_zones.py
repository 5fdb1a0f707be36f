"""The DST rule of locks.schedule (Vixie cron's), proven over every zone zoneinfo knows and every
year 1970-2037 with random expressions (Hypothesis), then shown on named nights a reader can
check by hand (docs/jobs.md, "Time zones and DST").

Examples are drawn near a change of the zone's offset most of the time: a random instant of a
random year almost never lies on a DST night, and in most years of most zones the offset never
changes, so the year is drawn among the zone's years of a change. The number of examples is the
Hypothesis profile's (tests/locks/conftest.py: 1,000 a property under CI).
"""

from __future__ import annotations

import zoneinfo
from datetime import UTC, date, datetime, timedelta
from functools import cache, lru_cache
from importlib import resources
from itertools import pairwise
from zoneinfo import ZoneInfo

import pytest
from croniter import croniter
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from locks import schedule
from locks.schedule import (
    GAP,
    REPEAT,
    Schedule,
    fixed_time,
    local_label,
    zone,
)

ZONES = sorted(resources.files("tzdata").joinpath("zones").read_text().split())  # the app's (zone())
SECOND = timedelta(seconds=1)
TINY = timedelta(microseconds=1)
NOT_TOO_SLOW = settings(suppress_health_check=[HealthCheck.too_slow])


@cache
def changes(name: str, year: int) -> tuple[datetime, ...]:
    """The instants the zone's offset changes in ``year`` (looked for every other day, then
    to the second; two changes within two days count as none): where the test looks hardest."""
    tz, found = zone(name), []
    moment = datetime(year, 1, 1, tzinfo=UTC)
    offset = moment.astimezone(tz).utcoffset()
    while moment.year == year:
        later = moment + timedelta(days=2)
        if later.astimezone(tz).utcoffset() != offset:
            low, high = moment, later
            while high - low > SECOND:
                middle = (low + (high - low) / 2).replace(microsecond=0)
                if middle.astimezone(tz).utcoffset() == offset:
                    low = middle
                else:
                    high = middle
            found.append(high)
            offset = later.astimezone(tz).utcoffset()
        moment = later
    return tuple(found)


@cache
def changing_years(name: str) -> tuple[int, ...]:
    """The years of 1970-2037 whose offset on 1 January, 1 July and the next 1 January are not all
    one: a year of DST, or of a new standard offset (a year whose changes all fall between two of
    these dates is left out)."""
    tz = zone(name)
    offsets = [
        datetime(year, month, 1, tzinfo=UTC).astimezone(tz).utcoffset()
        for year in range(1970, 2039)
        for month in (1, 7)
    ]
    return tuple(1970 + n for n in range(68) if len(set(offsets[2 * n : 2 * n + 3])) > 1)


@st.composite
def places(draw) -> tuple[str, datetime]:
    """A zone and an instant of 1970-2037: if the zone's offset ever changes, near one of its
    changes 9 times in 10 (a year of a change, then a change of that year)."""
    name = draw(st.sampled_from(ZONES))
    years = changing_years(name)
    if years and draw(st.integers(0, 9)):
        near = changes(name, draw(st.sampled_from(years)))
        if near:
            change = draw(st.sampled_from(near))
            return name, change + timedelta(seconds=draw(st.integers(-3 * 3600, 3 * 3600)))
    start = datetime(draw(st.integers(1970, 2037)), 1, 1, tzinfo=UTC)
    return name, start + timedelta(seconds=draw(st.integers(0, 364 * 86400)))


def _list(values) -> str:
    return ",".join(str(v) for v in sorted(set(values)))


FIXED_MINUTES = st.one_of(
    st.integers(0, 59).map(str), st.lists(st.integers(0, 59), min_size=2, max_size=3).map(_list)
)
MINUTES = st.one_of(
    FIXED_MINUTES, st.just("*"), st.sampled_from([5, 10, 15, 20, 30, 45]).map(lambda n: f"*/{n}")
)
FIXED_HOURS = st.one_of(
    st.integers(0, 23).map(str),
    st.lists(st.integers(0, 23), min_size=2, max_size=3).map(_list),
    st.tuples(st.integers(0, 22), st.integers(1, 6)).map(lambda p: f"{p[0]}-{min(p[0] + p[1], 23)}"),
)
HOURS = st.one_of(FIXED_HOURS, st.just("*"), st.sampled_from([2, 3, 4, 6]).map(lambda n: f"*/{n}"))
DAYS = st.one_of(
    st.just("* * *"),
    st.integers(1, 28).map(lambda d: f"{d} * *"),
    st.integers(0, 6).map(lambda d: f"* * {d}"),
)


@st.composite
def expressions(draw, hours=HOURS, minutes=MINUTES) -> str:
    return f"{draw(minutes)} {draw(hours)} {draw(DAYS)}"


def wall(moment: datetime, tz: ZoneInfo) -> datetime:
    return moment.astimezone(tz).replace(tzinfo=None, fold=0)


def gap_before(moment: datetime, tz: ZoneInfo) -> tuple[datetime, datetime] | None:
    """The wall times [start, end) the clock skipped at ``moment``, if it jumped forward there."""
    start, end = wall(moment - SECOND, tz) + SECOND, wall(moment, tz)
    return (start, end) if start < end else None


@lru_cache(maxsize=4096)
def first_match(expression: str, start: datetime, end: datetime) -> datetime | None:
    """The first wall time in [start, end) that ``expression`` matches."""
    found = croniter(expression, start - TINY).get_next(datetime)
    return found if found < end else None


def matches(expression: str, moment: datetime) -> bool:
    """Whether the wall time ``moment`` (naive) matches ``expression``."""
    return first_match(expression, moment, moment + TINY) is not None


def scheduled_wall(expression: str, slot: datetime, tz: ZoneInfo) -> datetime:
    """The wall time ``slot`` stands for: its own, or the matching one in the gap it follows."""
    own = wall(slot, tz)
    if matches(expression, own):
        return own
    gap = gap_before(slot, tz)
    assert gap is not None, (expression, slot, own)
    found = first_match(expression, *gap)
    assert found is not None, (expression, slot, gap)
    return found


# --- properties ---------------------------------------------------------------------------


@NOT_TOO_SLOW
@given(place=places(), expression=expressions())
def test_slots_strictly_increase_and_step_back_to_each_other(place, expression):
    name, start = place
    slots = Schedule(expression, name).upcoming(start, 8)
    assert all(a < b for a, b in pairwise(slots)), slots
    assert all(slot.tzinfo is UTC and slot > start for slot in slots)
    for earlier, later in pairwise(slots):
        assert Schedule(expression, name).slot_before(later) == earlier
    assert Schedule(expression, name).previous(slots[-1], len(slots)) == slots[::-1]


@NOT_TOO_SLOW
@given(place=places(), expression=expressions())
def test_each_slot_matches_its_wall_time_or_follows_a_gap_holding_one(place, expression):
    name, start = place
    tz = zone(name)
    for slot in Schedule(expression, name).upcoming(start, 6):
        local = slot.astimezone(tz)
        if matches(expression, wall(slot, tz)):
            repeated = wall(slot, tz).replace(tzinfo=tz, fold=1).astimezone(UTC) != wall(slot, tz).replace(
                tzinfo=tz, fold=0
            ).astimezone(UTC)
            # a second occurrence only under a wildcard hour
            assert not (repeated and local.fold == 1 and fixed_time(expression)), (expression, slot)
            assert Schedule(expression, name).dst_rule(slot) == (REPEAT if repeated else None)
            continue
        gap = gap_before(slot, tz)
        assert gap is not None and fixed_time(expression), (expression, slot, local)
        assert first_match(expression, *gap) is not None, (expression, slot, gap)
        assert Schedule(expression, name).dst_rule(slot) == GAP


@NOT_TOO_SLOW
@given(place=places(), expression=expressions(hours=FIXED_HOURS, minutes=FIXED_MINUTES))
def test_a_fixed_time_expression_never_has_two_slots_at_one_wall_time(place, expression):
    name, start = place
    tz = zone(name)
    slots = Schedule(expression, name).upcoming(start - timedelta(hours=6), 12)
    walls = [wall(slot, tz) for slot in slots]
    assert len(set(walls)) == len(walls), list(zip(slots, walls, strict=True))


@NOT_TOO_SLOW
@given(place=places(), minute=st.integers(0, 59), hour=st.integers(0, 23))
def test_a_daily_expression_has_one_slot_on_every_local_date(place, minute, hour):
    name, start = place
    tz, expression = zone(name), f"{minute} {hour} * * *"
    slots = Schedule(expression, name).upcoming(start - timedelta(days=2), 5)
    dates = [scheduled_wall(expression, slot, tz).date() for slot in slots]
    assert [b - a for a, b in pairwise(dates)] == [timedelta(days=1)] * 4, (slots, dates)


@NOT_TOO_SLOW
@given(place=places(), expression=expressions(), fraction=st.floats(0, 1, exclude_max=True))
def test_the_next_slot_is_the_same_from_a_slot_and_from_any_instant_before_the_next(
    place, expression, fraction
):
    name, start = place
    slot = Schedule(expression, name).next_slot(start)
    following = Schedule(expression, name).next_slot(slot)
    between = slot + timedelta(microseconds=int((following - slot) / TINY * fraction))
    assert slot <= between < following
    assert Schedule(expression, name).next_slot(between) == following
    assert Schedule(expression, name).slot_at_or_before(between) == slot
    assert Schedule(expression, name).is_slot(slot) and Schedule(expression, name).check(slot) == slot


def brute_force(expression: str, tz: ZoneInfo, start: datetime, end: datetime) -> list[datetime]:
    """The rule read literally, instant by instant, on every whole minute in [start, end)."""
    minutes = [start + timedelta(minutes=n) for n in range(int((end - start) / timedelta(minutes=1)))]
    walls = [wall(moment, tz) for moment in minutes]
    # Every matching wall time from the earliest a gap before one of these instants holds to
    # the latest wall time among them (croniter's reading of the expression).
    low = min(wall(moment - SECOND, tz) for moment in minutes) - timedelta(minutes=1)
    matching, high = set(), max(walls) + timedelta(minutes=1)
    iterator = croniter(expression, low)
    while (found := iterator.get_next(datetime)) < high:
        matching.add(found)
    named, slots = fixed_time(expression), []
    for moment, own in zip(minutes, walls, strict=True):
        first = own.replace(tzinfo=tz, fold=0).astimezone(UTC)
        repeated = own.replace(tzinfo=tz, fold=1).astimezone(UTC) != first
        second_time = repeated and moment.astimezone(tz).fold == 1
        gap = gap_before(moment, tz)
        its_own = own in matching and not (second_time and named)
        moved_here = named and gap is not None and any(gap[0] <= other < gap[1] for other in matching)
        if its_own or moved_here:
            slots.append(moment)
    return slots


@NOT_TOO_SLOW
@given(place=places(), expression=expressions())
def test_the_slots_are_exactly_the_rule_read_minute_by_minute(place, expression):
    name, start = place
    tz = zone(name)
    start = start.replace(second=0, microsecond=0)
    end = start + timedelta(hours=2)
    offsets = {start.astimezone(tz).utcoffset(), end.astimezone(tz).utcoffset()}
    assume(all(offset.seconds % 60 == 0 for offset in offsets))  # whole-minute wall times (no LMT)
    assume(all(change.second == 0 for change in changes(name, start.year)))
    slots = []
    moment = Schedule(expression, name).next_slot(start - TINY)
    while moment < end:
        slots.append(moment)
        moment = Schedule(expression, name).next_slot(moment)
    assert slots == brute_force(expression, tz, start, end)


# --- named nights, to check by hand ----------------------------------------------------


def slots_of(expression: str, name: str, start: str, end: str) -> list[str]:
    """Each slot in [start, end) (UTC ISO) as "UTC -> local"."""
    tz, first, last = zone(name), datetime.fromisoformat(start), datetime.fromisoformat(end)
    shown, moment = [], Schedule(expression, name).next_slot(first - TINY)
    while moment < last:
        shown.append(f"{moment:%H:%M}Z {moment.astimezone(tz):%H:%M %Z}")
        moment = Schedule(expression, name).next_slot(moment)
    return shown


NIGHTS = [
    # Europe/Berlin, spring forward 2027-03-28: 02:00 CET -> 03:00 CEST at 01:00Z.
    (
        "30 2 * * *",
        "Europe/Berlin",
        "2027-03-27T00:00Z",
        "2027-03-29T12:00Z",
        ["01:30Z 02:30 CET", "01:00Z 03:00 CEST", "00:30Z 02:30 CEST"],
    ),
    (
        "0 * * * *",
        "Europe/Berlin",
        "2027-03-28T00:00Z",
        "2027-03-28T03:00Z",
        ["00:00Z 01:00 CET", "01:00Z 03:00 CEST", "02:00Z 04:00 CEST"],
    ),
    # fall back 2027-10-31: 03:00 CEST -> 02:00 CET at 01:00Z; 02:30 runs at its first occurrence.
    (
        "30 2 * * *",
        "Europe/Berlin",
        "2027-10-30T12:00Z",
        "2027-11-01T12:00Z",
        ["00:30Z 02:30 CEST", "01:30Z 02:30 CET"],
    ),
    (
        "30 * * * *",
        "Europe/Berlin",
        "2027-10-30T23:00Z",
        "2027-10-31T03:00Z",
        ["23:30Z 01:30 CEST", "00:30Z 02:30 CEST", "01:30Z 02:30 CET", "02:30Z 03:30 CET"],
    ),
    # America/New_York 2027-03-14 02:00 EST -> 03:00 EDT; 2027-11-07 02:00 EDT -> 01:00 EST.
    ("15 2 * * *", "America/New_York", "2027-03-14T05:00Z", "2027-03-14T09:00Z", ["07:00Z 03:00 EDT"]),
    # A starred minute makes a wildcard job, as in Vixie cron (issue 35): both real hours, no gap slot.
    (
        "*/30 1 * * *",
        "America/New_York",
        "2027-11-07T04:00Z",
        "2027-11-07T08:00Z",
        ["05:00Z 01:00 EDT", "05:30Z 01:30 EDT", "06:00Z 01:00 EST", "06:30Z 01:30 EST"],
    ),
    (
        "*/15 2 * * *",
        "Europe/Berlin",
        "2027-10-30T12:00Z",
        "2027-10-31T12:00Z",
        [
            f"{h}:{m}Z 02:{m} {abbr}"
            for h, abbr in (("00", "CEST"), ("01", "CET"))
            for m in ("00", "15", "30", "45")
        ],
    ),
    ("*/15 2 * * *", "Europe/Berlin", "2027-03-27T12:00Z", "2027-03-28T12:00Z", []),
    (
        "*/30 * * * *",
        "America/New_York",
        "2027-11-07T05:00Z",
        "2027-11-07T07:00Z",
        ["05:00Z 01:00 EDT", "05:30Z 01:30 EDT", "06:00Z 01:00 EST", "06:30Z 01:30 EST"],
    ),
    # Australia/Lord_Howe moves half an hour: 2027-10-03 02:00 -> 02:30 (+1030 -> +11), 2027-04-04 02:00 -> 01:30.
    (
        "10,40 2 * * *",
        "Australia/Lord_Howe",
        "2027-10-02T15:00Z",
        "2027-10-02T17:00Z",
        ["15:30Z 02:30 +11", "15:40Z 02:40 +11"],
    ),
    ("45 1 * * *", "Australia/Lord_Howe", "2027-04-03T14:00Z", "2027-04-03T16:00Z", ["14:45Z 01:45 +11"]),
    (
        "*/15 * * * *",
        "Australia/Lord_Howe",
        "2027-04-03T14:30Z",
        "2027-04-03T15:30Z",
        ["14:30Z 01:30 +11", "14:45Z 01:45 +11", "15:00Z 01:30 +1030", "15:15Z 01:45 +1030"],
    ),
    # Pacific/Chatham, at :45: 2027-09-26 02:45 -> 03:45 (+1245 -> +1345), 2027-04-04 03:45 -> 02:45.
    ("0 3 * * *", "Pacific/Chatham", "2027-09-25T12:00Z", "2027-09-25T16:00Z", ["14:00Z 03:45 +1345"]),
    ("0 3 * * *", "Pacific/Chatham", "2027-04-03T12:00Z", "2027-04-03T16:00Z", ["13:15Z 03:00 +1345"]),
    # America/Santiago changes at midnight: 2027-09-05 00:00 -> 01:00 (-04 -> -03), 2027-04-03 24:00 -> 23:00.
    ("30 0 * * *", "America/Santiago", "2027-09-04T12:00Z", "2027-09-05T12:00Z", ["04:00Z 01:00 -03"]),
    (
        "0 * * * *",
        "America/Santiago",
        "2027-09-05T02:00Z",
        "2027-09-05T06:00Z",
        ["02:00Z 22:00 -04", "03:00Z 23:00 -04", "04:00Z 01:00 -03", "05:00Z 02:00 -03"],
    ),
    ("30 23 * * *", "America/Santiago", "2027-04-03T12:00Z", "2027-04-04T12:00Z", ["02:30Z 23:30 -03"]),
    (
        "0 * * * *",
        "America/Santiago",
        "2027-04-04T01:00Z",
        "2027-04-04T05:00Z",
        ["01:00Z 22:00 -03", "02:00Z 23:00 -03", "03:00Z 23:00 -04", "04:00Z 00:00 -04"],
    ),
]


@pytest.mark.parametrize(("expression", "zone", "start", "end", "expected"), NIGHTS)
def test_named_nights(expression, zone, start, end, expected):
    assert slots_of(expression, zone, start, end) == expected


def test_berlin_hourly_runs_23_and_25_times_on_its_dst_days():
    berlin = zone("Europe/Berlin")
    for day, count in ((date(2027, 3, 28), 23), (date(2027, 10, 31), 25), (date(2027, 6, 1), 24)):
        midnight = datetime(day.year, day.month, day.day, tzinfo=berlin)
        slots = Schedule("0 * * * *", "Europe/Berlin").upcoming(midnight - TINY, 26)
        assert sum(slot.astimezone(berlin).date() == day for slot in slots) == count
        half_hourly = Schedule("*/30 * * * *", "Europe/Berlin").upcoming(midnight - TINY, 52)
        assert sum(slot.astimezone(berlin).date() == day for slot in half_hourly) == 2 * count


def test_utc_is_the_default_and_keeps_every_slot():
    assert Schedule("30 2 * * *").next_slot(datetime(2027, 3, 28, tzinfo=UTC)) == datetime(
        2027, 3, 28, 2, 30, tzinfo=UTC
    )
    assert Schedule("30 2 * * *").dst_rule(datetime(2027, 3, 28, 2, 30, tzinfo=UTC)) is None


def test_a_tick_that_is_no_slot_names_the_zone_and_the_nearest_slots():
    with pytest.raises(
        ValueError,
        match=r"\(Europe/Berlin\); the nearest valid slots are 2027-03-28T01:00:00\+00:00 "
        r"and 2027-03-29T00:30:00\+00:00",
    ):
        Schedule("30 2 * * *", "Europe/Berlin").check(datetime(2027, 3, 28, 1, 30, tzinfo=UTC))


def test_zones_come_from_the_pinned_tzdata_whatever_this_hosts_zone_files_say(tmp_path):
    """Issue 35, item 4: ``ZoneInfo`` reads the operating system's files first (``zoneinfo.TZPATH``),
    so two hosts with different zone data ran one local slot at different instants. Here this host's
    "Europe/Berlin" is Tokyo's file; the app's slots stay Berlin's, and ``ZoneInfo`` is left alone."""
    (tmp_path / "Europe").mkdir()
    tokyo = resources.files("tzdata").joinpath("zoneinfo", "Asia", "Tokyo").read_bytes()
    (tmp_path / "Europe" / "Berlin").write_bytes(tokyo)
    zoneinfo.reset_tzpath([str(tmp_path)])
    ZoneInfo.clear_cache()
    schedule._tzdata.cache_clear()
    try:
        host = ZoneInfo("Europe/Berlin")
        slot = Schedule("30 2 * * *", "Europe/Berlin").slot_at_or_before(datetime(2027, 1, 2, tzinfo=UTC))
        label = local_label(slot, tz="Europe/Berlin")
    finally:
        zoneinfo.reset_tzpath()
        ZoneInfo.clear_cache()
        schedule._tzdata.cache_clear()
    assert host.utcoffset(datetime(2027, 1, 1)) == timedelta(hours=9)  # this host's files: Tokyo's
    assert (slot, label) == (datetime(2027, 1, 1, 1, 30, tzinfo=UTC), "2027-01-01 02:30 CET")
