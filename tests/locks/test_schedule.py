from datetime import UTC, datetime, timedelta

import pytest

from locks.schedule import is_valid_expression, nearest_tick, next_tick, period

HOURLY = "0 * * * *"


def at(hour: int, minute: int, second: int = 0) -> datetime:
    return datetime(2026, 11, 30, hour, minute, second, tzinfo=UTC)


@pytest.mark.parametrize(
    ("now", "tick"),
    [
        (at(14, 0), at(14, 0)),  # on time
        (at(13, 53), at(14, 0)),  # a host 7 minutes fast
        (at(14, 7), at(14, 0)),  # a host 7 minutes slow, or cron firing late
        (at(14, 29, 59), at(14, 0)),
        (at(14, 30, 1), at(15, 0)),
        (at(23, 45), datetime(2026, 12, 1, 0, 0, tzinfo=UTC)),  # across midnight
    ],
)
def test_the_tick_is_the_nearest_slot(now, tick):
    assert nearest_tick(HOURLY, now=now) == tick


def test_other_schedules():
    assert nearest_tick("*/15 * * * *", now=at(14, 8)) == at(14, 15)
    assert nearest_tick("30 2 * * *", now=at(2, 31)) == at(2, 30)


def test_next_tick_and_period():
    assert next_tick(HOURLY, now=at(14, 0)) == at(15, 0)
    assert period(HOURLY, now=at(14, 10)) == timedelta(hours=1)
    assert period("*/15 * * * *", now=at(14, 10)) == timedelta(minutes=15)


@pytest.mark.parametrize(
    ("expression", "valid"),
    [(HOURLY, True), ("*/5 * * * *", True), ("nope", False), ("", False), (None, False)],
)
def test_expression_validation(expression, valid):
    assert is_valid_expression(expression) is valid
