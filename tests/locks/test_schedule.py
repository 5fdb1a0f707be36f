import time
from datetime import UTC, datetime, timedelta
from zoneinfo import ZoneInfo

import pytest
from django.utils import timezone

from locks.schedule import (
    InvalidTick,
    Schedule,
    is_valid_expression,
)

HOURLY = "0 * * * *"
WINDOW = timedelta(minutes=5)


def at(hour: int, minute: int, second: int = 0, *, day: int = 30) -> datetime:
    return datetime(2026, 11, day, hour, minute, second, tzinfo=UTC)


@pytest.mark.parametrize(
    ("now", "tick"),
    [
        (at(7, 37), at(7, 0)),  # a manual or late run claims the slot it follows
        (at(7, 56), at(8, 0)),  # a host 4 minutes fast names the slot its peers name
        (at(7, 55), at(8, 0)),  # the window's edge is inside
        (at(7, 54, 59), at(7, 0)),
        (at(8, 0), at(8, 0)),  # a slot exactly at now is at or before now
        (at(8, 4, 59), at(8, 0)),  # a host 5 minutes slow, or cron firing late
        (at(8, 54, 59), at(8, 0)),
        (at(8, 55), at(9, 0)),
        (at(23, 57), datetime(2026, 12, 1, 0, 0, tzinfo=UTC)),  # across midnight and month
    ],
)
def test_the_tick_is_the_upcoming_slot_within_the_window_else_the_latest(now, tick):
    assert Schedule(HOURLY).current(now, window=WINDOW) == tick


def test_the_window_is_capped_at_a_quarter_of_the_gap():
    every_15 = "*/15 * * * *"
    assert Schedule(every_15).current(at(14, 11, 15), window=WINDOW) == at(14, 15)  # 3:45 ahead
    assert Schedule(every_15).current(at(14, 11, 14), window=WINDOW) == at(14, 0)  # 3:46 ahead


def test_a_zero_window_never_claims_ahead():
    assert Schedule(HOURLY).current(at(7, 59, 59), window=timedelta(0)) == at(7, 0)
    assert Schedule(HOURLY).current(at(8, 0), window=timedelta(0)) == at(8, 0)


def test_a_daily_schedule_claims_todays_slot_once_passed_else_yesterdays():
    daily = "30 7 * * *"
    assert Schedule(daily).current(at(7, 37), window=WINDOW) == at(7, 30)
    assert Schedule(daily).current(at(7, 20), window=WINDOW) == at(7, 30, day=29)
    assert Schedule(daily).current(at(7, 26), window=WINDOW) == at(7, 30)


def test_an_uneven_schedule_caps_the_window_by_the_gap_around_now():
    # 08:00 and 09:00 daily: an hour's gap before 09:00, 23 hours before 08:00.
    uneven = "0 8,9 * * *"
    window = timedelta(minutes=20)
    assert Schedule(uneven).current(at(8, 44), window=window) == at(8, 0)  # cap 15 min
    assert Schedule(uneven).current(at(8, 46), window=window) == at(9, 0)
    assert Schedule(uneven).current(at(7, 41), window=window) == at(8, 0)  # cap 5 h 45 min
    assert Schedule(uneven).period(at(8, 30)) == timedelta(hours=1)
    assert Schedule(uneven).period(at(10, 0)) == timedelta(hours=23)


def test_slot_helpers():
    assert Schedule(HOURLY).slot_at_or_before(at(8, 0)) == at(8, 0)
    assert Schedule(HOURLY).slot_at_or_before(at(8, 0) - timedelta(microseconds=1)) == at(7, 0)
    assert Schedule(HOURLY).slot_before(at(8, 0)) == at(7, 0)
    assert Schedule(HOURLY).slot_before(at(8, 0, 1)) == at(8, 0)
    assert Schedule(HOURLY).next_slot(at(14, 0)) == at(15, 0)
    assert Schedule("0 8,9 * * *").previous(at(11, 1), 3) == [at(9, 0), at(8, 0), at(9, 0, day=29)]
    assert Schedule(HOURLY).is_slot(at(8, 0)) and not Schedule(HOURLY).is_slot(at(8, 0, 1))
    assert Schedule(HOURLY).is_slot(at(8, 0).astimezone(ZoneInfo("Asia/Kolkata")))  # 13:30 there


def test_period():
    assert Schedule(HOURLY).period(at(14, 10)) == timedelta(hours=1)
    assert Schedule(HOURLY).period(at(14, 0)) == timedelta(hours=1)
    assert Schedule("*/15 * * * *").period(at(14, 10)) == timedelta(minutes=15)


def test_results_are_aware_utc_whatever_the_input_zone():
    berlin = at(8, 37).astimezone(ZoneInfo("Europe/Berlin"))
    tick = Schedule(HOURLY).current(berlin, window=WINDOW)
    assert tick == at(8, 0)
    assert tick.tzinfo is UTC and tick.fold == 0


def test_a_naive_now_is_refused():
    with pytest.raises(ValueError, match="has no time zone"):
        Schedule(HOURLY).current(datetime(2026, 11, 30, 8, 0), window=WINDOW)


@pytest.mark.parametrize(
    ("expression", "valid"),
    [(HOURLY, True), ("*/5 * * * *", True), ("nope", False), ("", False), (None, False)],
)
def test_expression_validation(expression, valid):
    assert is_valid_expression(expression) is valid


# --- DST nights in Europe/Berlin: cron expressions name UTC times ------------------


@pytest.fixture
def berlin(settings):
    """TIME_ZONE and the process's TZ (Django's test signal sets both) in Europe/Berlin."""
    settings.TIME_ZONE = "Europe/Berlin"
    assert time.tzname == ("CET", "CEST")
    assert timezone.get_current_timezone_name() == "Europe/Berlin"
    yield
    # the settings fixture restores TIME_ZONE, and with it TZ, afterwards


def utc_hours(start: datetime, count: int) -> list[datetime]:
    return [start + timedelta(hours=n) for n in range(count)]


# Fall back: 2026-10-25 03:00 CEST -> 02:00 CET at 01:00 UTC. Spring forward:
# 2026-03-29 02:00 CET -> 03:00 CEST at 01:00 UTC.
NIGHTS = {
    "fall-back": datetime(2026, 10, 24, 22, 0, tzinfo=UTC),
    "spring-forward": datetime(2026, 3, 28, 22, 0, tzinfo=UTC),
}


@pytest.mark.parametrize("night", list(NIGHTS))
def test_hourly_every_utc_hour_of_a_dst_night_is_its_own_slot(berlin, night):
    hours = utc_hours(NIGHTS[night], 7)  # 22:00 .. 04:00 UTC, the change at 01:00
    claimed = []
    for hour in hours:
        assert Schedule(HOURLY).is_slot(hour)
        assert Schedule(HOURLY).period(hour) == timedelta(hours=1)
        for offset in (timedelta(0), timedelta(minutes=37), timedelta(minutes=59, seconds=59)):
            assert Schedule(HOURLY).period(hour + offset) == timedelta(hours=1)
        assert Schedule(HOURLY).current(hour + timedelta(minutes=37), window=WINDOW) == hour
        assert Schedule(HOURLY).current(hour - timedelta(seconds=20), window=WINDOW) == hour
        assert Schedule(HOURLY).current(hour + timedelta(seconds=20), window=WINDOW) == hour
        claimed.append(Schedule(HOURLY).current(hour, window=WINDOW))
        assert Schedule(HOURLY).next_slot(hour) == hour + timedelta(hours=1)
    assert claimed == hours  # seven distinct slots, one per UTC hour
    assert Schedule(HOURLY).previous(hours[-1], 7) == hours[::-1]


def test_two_copies_forty_seconds_apart_at_fall_back_name_one_slot(berlin):
    change = datetime(2026, 10, 25, 1, 0, tzinfo=UTC)
    # 02:59:40 CEST and 02:00:20 CET on the wall clock: an hour apart there, 40 s here.
    early, late = change - timedelta(seconds=20), change + timedelta(seconds=20)
    assert timezone.localtime(early).hour == 2 and timezone.localtime(late).hour == 2
    assert Schedule(HOURLY).current(early, window=WINDOW) == change
    assert Schedule(HOURLY).current(late, window=WINDOW) == change


@pytest.mark.parametrize("night", list(NIGHTS))
def test_daily_at_0230_is_0230_utc_on_a_dst_night(berlin, night):
    daily = "30 2 * * *"
    day = NIGHTS[night] + timedelta(hours=2)  # midnight UTC of the night's date
    slot = day + timedelta(hours=2, minutes=30)
    assert Schedule(daily).is_slot(slot)
    assert Schedule(daily).current(slot + timedelta(minutes=7), window=WINDOW) == slot
    assert Schedule(daily).current(slot - timedelta(minutes=4), window=WINDOW) == slot
    assert Schedule(daily).current(slot - timedelta(minutes=6), window=WINDOW) == slot - timedelta(days=1)
    for hour in utc_hours(NIGHTS[night], 7):  # 01:00 UTC is when Berlin's clocks change
        assert Schedule(daily).period(hour) == timedelta(days=1)
        assert Schedule(daily).slot_at_or_before(hour).time() == slot.time()
    assert Schedule(daily).next_slot(day) == slot


# --- Schedule.check: may a run claim this tick? ---------------------------------------


def test_a_slot_is_returned_in_utc():
    berlin = at(15, 0).astimezone(ZoneInfo("Europe/Berlin"))
    checked = Schedule(HOURLY).check(berlin)
    assert (checked, checked.tzinfo, str(berlin.tzinfo)) == (at(15, 0), UTC, "Europe/Berlin")


def test_a_tick_that_is_no_slot_names_the_nearest_slots():
    with pytest.raises(InvalidTick) as refused:
        Schedule(HOURLY).check(at(14, 30))
    assert isinstance(refused.value, ValueError)
    assert str(refused.value) == (
        "tick 2026-11-30T14:30:00+00:00 is not a slot of the schedule '0 * * * *' (UTC); "
        "the nearest valid slots are 2026-11-30T14:00:00+00:00 and 2026-11-30T15:00:00+00:00"
    )


def test_a_tick_is_checked_without_the_database_clock():
    """How far ahead a tick may lie is the lease's to judge; the slot check is pure."""
    assert Schedule(HOURLY).check(at(16, 0) + timedelta(days=365 * 36)) == at(16, 0) + timedelta(
        days=365 * 36
    )


def test_a_tick_refused_as_too_far_ahead_names_the_slots_a_run_may_claim():
    message = Schedule(HOURLY).tick_ahead_message(
        at(16, 0), db_now=at(14, 57), horizon=timedelta(minutes=5), window=WINDOW
    )
    assert message == (
        "tick 2026-11-30T16:00:00+00:00 is more than the tick window (0:05:00) ahead of the database "
        "clock (2026-11-30T14:57:00+00:00); the latest slot it may name is 2026-11-30T15:00:00+00:00, "
        "the one a run claims now is 2026-11-30T15:00:00+00:00"
    )
    # Past the tick window the run claims the slot it follows; the clock is shown to the second.
    daily = "0 0 * * *"
    message = Schedule(daily).tick_ahead_message(
        at(0, 0, day=29) + timedelta(days=3), db_now=at(14, 2, 30), horizon=timedelta(days=1), window=WINDOW
    )
    assert message.endswith(
        "(1 day, 0:00:00) ahead of the database clock (2026-11-30T14:02:30+00:00); the latest slot it may "
        "name is 2026-12-01T00:00:00+00:00, the one a run claims now is 2026-11-30T00:00:00+00:00"
    )
