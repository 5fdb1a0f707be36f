"""Admin for contests (written by the sync, read-only here) and reminders."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin
from django.db.models import Case, CharField, Value, When
from django.db.models.functions import Now
from django.http import HttpRequest
from django.utils.html import format_html
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from contests.models import Contest, Reminder
from contests.services import SYNCED_FIELDS
from locks.admin import ReadOnlyAdminMixin

UPCOMING, DUE, STALE = "upcoming", "due", "stale"
REMINDER_STATES = {UPCOMING: _("upcoming"), DUE: _("due"), STALE: _("stale")}
REMINDER_COLOURS = {UPCOMING: "#15803d", DUE: "#1d4ed8", STALE: "#6b7280"}


def length(delta: timedelta | None) -> str:
    """A contest length: "2 h", "2 h 15 min", "14 d"."""
    if delta is None:
        return "—"
    minutes = int(delta.total_seconds()) // 60
    days, minutes = divmod(minutes, 24 * 60)
    hours, minutes = divmod(minutes, 60)
    parts = []
    if days:
        parts.append(gettext("%(d)d d") % {"d": days})
    if hours:
        parts.append(gettext("%(h)d h") % {"h": hours})
    if minutes or not parts:
        parts.append(gettext("%(m)d min") % {"m": minutes})
    return " ".join(parts)


class UpcomingFilter(admin.SimpleListFilter):
    title = _("upcoming")
    parameter_name = "upcoming"

    def lookups(self, request, model_admin):
        return [("yes", _("Yes")), ("no", _("No"))]

    def queryset(self, request, queryset):
        if self.value() == "yes":
            return queryset.upcoming()
        if self.value() == "no":
            return queryset.exclude(pk__in=Contest.objects.upcoming().values("pk"))
        return queryset


@admin.register(Contest)
class ContestAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    empty_value_display = "—"
    list_display = (
        "name",
        "contest_id",
        "phase",
        "type",
        "start_time",
        "contest_length",
        "removed",
        "codeforces",
    )
    list_filter = ("phase", "type", ("removed_at", admin.EmptyFieldListFilter), UpcomingFilter)
    # The id is an integer: an exact match on its text, so "1843" finds contest 1843 only.
    search_fields = ("name", "contest_id__exact")
    date_hierarchy = "start_time"
    readonly_fields = (
        "platform",
        "contest_id",
        *SYNCED_FIELDS,
        "codeforces",
        "first_seen_at",
        "updated_at",
        "removed_at",
        "fingerprint",
    )
    fields = readonly_fields

    # Contests are written by the sync only: what Codeforces says wins.

    def get_search_results(self, request: HttpRequest, queryset, search_term: str):
        queryset, duplicates = super().get_search_results(request, queryset, search_term)
        # Picking a contest for a new reminder: only those that have not started.
        if request.GET.get("app_label") == "contests" and request.GET.get("model_name") == "reminder":
            queryset = queryset.upcoming()
        return queryset, duplicates

    @admin.display(description=_("duration"), ordering="duration")
    def contest_length(self, contest: Contest) -> str:
        return length(contest.duration)

    @admin.display(description=_("removed"), boolean=True, ordering="removed_at")
    def removed(self, contest: Contest) -> bool:
        return contest.removed_at is not None

    @admin.display(description=_("on Codeforces"))
    def codeforces(self, contest: Contest) -> str:
        return format_html(
            '<a href="{}" target="_blank" rel="noopener noreferrer">{}</a>', contest.url, contest.contest_id
        )


def reminder_state() -> Case:
    """upcoming / due / stale, by the database clock. Stale is exactly what
    the sync prunes (``Reminder.objects.stale()``)."""
    return Case(
        When(pk__in=Reminder.objects.stale().values("pk"), then=Value(STALE)),
        When(remind_at__lte=Now(), then=Value(DUE)),
        default=Value(UPCOMING),
        output_field=CharField(),
    )


class ReminderStateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return list(REMINDER_STATES.items())

    def queryset(self, request, queryset):
        if self.value() in REMINDER_STATES:
            return queryset.filter(state=self.value())
        return queryset


@admin.register(Reminder)
class ReminderAdmin(admin.ModelAdmin):
    empty_value_display = "—"
    list_display = ("user", "contest", "remind_at", "reminder_state", "created_at")
    list_select_related = ("user", "contest")
    list_filter = (ReminderStateFilter,)
    search_fields = ("user__username", "contest__name")
    autocomplete_fields = ("user", "contest")
    date_hierarchy = "remind_at"
    readonly_fields = ("reminder_state", "created_at")

    def get_queryset(self, request: HttpRequest):
        return super().get_queryset(request).annotate(state=reminder_state())

    @admin.display(description=_("state"), ordering="state")
    def reminder_state(self, reminder: Reminder) -> str:
        state = getattr(reminder, "state", None)
        if state is None:
            return "—"
        return format_html(
            '<span style="display:inline-block;padding:1px 8px;border-radius:9px;color:#fff;'
            'background:{};font-weight:600">{}</span>',
            REMINDER_COLOURS[state],
            REMINDER_STATES[state],
        )
