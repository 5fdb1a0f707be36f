"""Admin for contests (written by the sync, read-only here) and reminders."""

from __future__ import annotations

from datetime import timedelta

from django.contrib import admin, messages
from django.db.models import Case, CharField, Value, When
from django.db.models.functions import Now
from django.http import HttpRequest
from django.template.response import TemplateResponse
from django.utils.html import format_html
from django.utils.text import Truncator
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from contests.models import OUTSTANDING, Contest, Reminder
from contests.reminders import retry_reminders
from contests.services import SYNCED_FIELDS
from locks import ReadOnlyAdminMixin, badge

UPCOMING, DUE, STALE = "upcoming", "due", "stale"
REMINDER_STATES = {UPCOMING: _("upcoming"), DUE: _("due"), STALE: _("stale")}
DELIVERED, PENDING, UNCERTAIN, FAILED = "delivered", "pending", "uncertain", "failed"
DELIVERY_STATES = {
    DELIVERED: _("delivered"),
    PENDING: _("pending"),
    UNCERTAIN: _("uncertain"),
    FAILED: _("failed"),
}


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
    """upcoming / due / stale, by the database clock, for reminders a run may still send
    (delivered, uncertain and failed ones have none: their delivery state says it all).
    Stale is exactly what the sync prunes (``Reminder.objects.stale()``), due exactly
    what the next send_reminders run sends (``Reminder.objects.due()``)."""
    return Case(
        When(pk__in=Reminder.objects.stale().values("pk"), then=Value(STALE)),
        When(~OUTSTANDING, then=Value(None)),
        When(remind_at__gt=Now(), then=Value(UPCOMING)),
        When(pk__in=Reminder.objects.due().values("pk"), then=Value(DUE)),
        default=Value(None),
        output_field=CharField(),
    )


def delivery_state() -> Case:
    """delivered / pending / uncertain / failed: what send_reminders recorded."""
    return Case(
        When(delivered_at__isnull=False, then=Value(DELIVERED)),
        When(uncertain_at__isnull=False, then=Value(UNCERTAIN)),
        When(failed_at__isnull=False, then=Value(FAILED)),
        default=Value(PENDING),
        output_field=CharField(),
    )


class ReminderStateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"
    states = REMINDER_STATES

    def lookups(self, request, model_admin):
        return list(self.states.items())

    def queryset(self, request, queryset):
        if self.value() in self.states:
            return queryset.filter(**{self.parameter_name: self.value()})
        return queryset


class DeliveryFilter(ReminderStateFilter):
    title = _("delivery")
    parameter_name = "delivery"
    states = DELIVERY_STATES


def _state_badge(state: str | None, labels: dict) -> str:
    return "—" if state is None else badge(labels[state], state)


@admin.register(Reminder)
class ReminderAdmin(admin.ModelAdmin):
    empty_value_display = "—"
    list_display = (
        "user",
        "contest",
        "remind_at",
        "reminder_state",
        "delivery",
        "attempts",
        "delivered_at",
        "short_error",
        "created_at",
    )
    list_select_related = ("user", "contest")
    list_filter = (ReminderStateFilter, DeliveryFilter)
    search_fields = ("user__username", "contest__name")
    autocomplete_fields = ("user", "contest")
    date_hierarchy = "remind_at"
    # Delivery is written by send_reminders only (docs/reminders.md).
    readonly_fields = (
        "reminder_state",
        "delivery",
        "created_at",
        "delivered_at",
        "attempts",
        "last_error",
        "claimed_until",
        "claimed_by",
        "failed_at",
        "uncertain_at",
    )
    actions = ("retry_delivery",)

    class Media:  # the badges' look (the locks admin's), then the reminders' own kinds
        css = {"all": ["locks/admin.css", "contests/admin.css"]}

    def get_queryset(self, request: HttpRequest):
        return super().get_queryset(request).annotate(state=reminder_state(), delivery=delivery_state())

    @admin.display(description=_("state"), ordering="state")
    def reminder_state(self, reminder: Reminder) -> str:
        return _state_badge(getattr(reminder, "state", None), REMINDER_STATES)

    @admin.display(description=_("delivery"), ordering="delivery")
    def delivery(self, reminder: Reminder) -> str:
        return _state_badge(getattr(reminder, "delivery", None), DELIVERY_STATES)

    @admin.display(description=_("last error"), ordering="last_error")
    def short_error(self, reminder: Reminder) -> str:
        return Truncator(reminder.last_error).chars(80) or "—"

    @admin.action(
        description=_("Retry delivery of the selected failed or uncertain reminders"), permissions=["change"]
    )
    def retry_delivery(self, request: HttpRequest, queryset) -> TemplateResponse | None:
        """Asks first (an uncertain reminder may already have reached its user), then makes
        the failed and uncertain ones pending again, logging each."""
        chosen = list(
            Reminder.objects.filter(pk__in=list(queryset.values_list("pk", flat=True)))
            .select_related("user", "contest")
            .annotate(delivery=delivery_state())
            .order_by("remind_at", "pk")
        )
        retryable = [r for r in chosen if r.delivery in {FAILED, UNCERTAIN}]
        if request.POST.get("post") != "yes":
            context = {
                **self.admin_site.each_context(request),
                "title": gettext("Retry delivery of reminders?"),
                "opts": self.opts,
                "reminders": retryable,
                "uncertain": sum(r.delivery == UNCERTAIN for r in retryable),
                "left_alone": len(chosen) - len(retryable),
                "chosen": chosen,
                "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
                "media": self.media,
            }
            return TemplateResponse(request, "admin/contests/reminder/retry_confirmation.html", context)
        count = retry_reminders(reminders=Reminder.objects.filter(pk__in=[r.pk for r in retryable]))
        for reminder in retryable:
            was = DELIVERY_STATES[reminder.delivery]
            self.log_change(
                request,
                reminder,
                gettext("Delivery retried; it was %(state)s: %(error)s")
                % {"state": was, "error": Truncator(reminder.last_error).chars(200) or "—"},
            )
        self.message_user(
            request,
            ngettext(
                "%(count)d reminder is pending again: the next run emails it.",
                "%(count)d reminders are pending again: the next run emails them.",
                count,
            )
            % {"count": count},
            messages.SUCCESS,
        )
        return None
