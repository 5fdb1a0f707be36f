"""How the locks admin shows times, states and counts: relative times are
measured against the database clock (``now`` is always ``db_now``)."""

from __future__ import annotations

from datetime import datetime, timedelta

from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator
from django.utils.timesince import timesince
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from locks.models import EXPIRED, FREE, HELD, OVERDUE, RunStatus

STATE_LABELS = {
    FREE: _("free"),
    HELD: _("held"),
    EXPIRED: _("expired, not released"),
    OVERDUE: _("heartbeat overdue"),
}
ERROR_EXCERPT = 80


def ago(when: datetime, *, now: datetime) -> str:
    """ "3 minutes ago", against ``now`` (the database clock)."""
    return gettext("%(time)s ago") % {"time": timesince(when, now)}


def duration(started: datetime | None, finished: datetime | None) -> str:
    """ "2.5 s" under a minute (job runs are often that short), else "4 minutes"."""
    if started is None or finished is None or finished < started:
        return "—"
    if finished - started < timedelta(minutes=1):
        return gettext("%(s).1f s") % {"s": (finished - started).total_seconds()}
    return timesince(started, finished)


def absolute(when: datetime | None) -> str:
    if when is None:
        return "—"
    return date_format(timezone.localtime(when), "Y-m-d H:i:s T")


def nowrap(text: str) -> str:
    return format_html('<span class="nowrap">{}</span>', text)


def stacked(main: str, detail: str) -> str:
    """A relative time over its absolute one."""
    return format_html('{}<br><small class="nowrap">{}</small>', main, detail)


def badge(text: str, kind: str, title: str = "") -> str:
    return format_html('<span class="lock-badge" data-kind="{}" title="{}">{}</span>', kind, title, text)


def state_badge(lock) -> str:
    """``lock`` comes from ``SyncLock.objects.with_state()``."""
    title = ""
    if lock.heartbeat_at is not None and lock.state != FREE:
        title = gettext("last heartbeat %(when)s") % {"when": ago(lock.heartbeat_at, now=lock.db_now)}
    return badge(STATE_LABELS[lock.state], lock.state, title)


def tick_progress(lock) -> str:
    """Whether the claimed tick is done; ``lock`` comes from ``with_state()``."""
    if lock.tick_done:
        return gettext("done")
    if lock.state in {HELD, OVERDUE}:
        return gettext("not done yet")
    return gettext("not done: a later run may retry it")


def status_badge(status: str) -> str:
    if not status:
        return "—"
    return badge(RunStatus(status).label, status)


def outcome_badge(outcome: str) -> str:
    """A tick ledger outcome (``locks.ledger``) as a badge."""
    return badge(gettext(outcome), f"tick-{outcome}")


def ledger_strip(ledger) -> str:
    """A ``locks.ledger.Ledger`` as a strip of cells, oldest left, newest right: one per slot,
    coloured by its outcome (locks/admin.css), the slot and outcome in its title."""
    cells = format_html_join(
        "",
        '<span class="tick-cell" data-outcome="{}" title="{}"></span>',
        ((slot.outcome, slot.describe()) for slot in reversed(ledger.slots)),
    )
    return format_html('<span class="tick-strip" data-job="{}">{}</span>', ledger.job, cells)


def excerpt(text: str) -> str:
    return Truncator(" ".join(text.split())).chars(ERROR_EXCERPT)


def counts(stats: dict, *, zeros: bool = True) -> str:
    """ "created 3 · fetched 1758 · …", by name: the JSON column keeps no key order (PostgreSQL's
    jsonb sorts keys its own way), so one order on every backend. Without ``zeros``, only
    the counts that are not 0."""
    stats = stats or {}
    return format_html_join(
        " · ",
        '<span class="nowrap">{} {}</span>',
        (
            (key, stats[key])
            for key in sorted(stats)
            if not isinstance(stats[key], dict) and (zeros or stats[key])
        ),
    )
