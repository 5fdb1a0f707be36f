"""Cron expressions to ticks: the scheduled slot a run belongs to."""

from datetime import datetime, timedelta

from croniter import croniter
from django.utils import timezone


def is_valid_expression(expression: str) -> bool:
    return isinstance(expression, str) and croniter.is_valid(expression)


def nearest_tick(expression: str, *, now: datetime) -> datetime:
    """The slot of ``expression`` nearest to ``now``.

    A host whose clock is a few minutes fast or slow, or whose cron daemon fires
    late, still names the same slot as its peers, so the tick deduplicates runs
    across hosts (docs/architecture.md, The lock).
    """
    local = timezone.localtime(now)
    following = croniter(expression, local - timedelta(microseconds=1)).get_next(datetime)
    preceding = croniter(expression, local).get_prev(datetime)
    return following if following - local < local - preceding else preceding


def next_tick(expression: str, *, now: datetime) -> datetime:
    return croniter(expression, timezone.localtime(now)).get_next(datetime)


def period(expression: str, *, now: datetime) -> timedelta:
    """The gap between the two slots after ``now`` (an hour for ``0 * * * *``)."""
    itr = croniter(expression, timezone.localtime(now))
    first = itr.get_next(datetime)
    return itr.get_next(datetime) - first
