"""Admin for job locks and their run history.

Lock and run rows are written only by ``locks.api``: here they are read-only.
The one write is the force release, which goes through ``api.force_release``
(the same service as ``manage.py locks release``) and is permission-gated.
Every state and relative time is computed against the database clock
(``db_now``, annotated on the queryset), never this host's clock.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import datetime, timedelta
from urllib.parse import urlencode

from django.conf import settings
from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from locks import api
from locks.models import JobRun, RunStatus, SyncLock
from locks.schedule import is_valid_expression, next_tick
from locks.selectors import EXPIRED, FREE, HELD, OVERDUE, lock_state

STUCK = (EXPIRED, OVERDUE)
STATE_LABELS = {
    FREE: _("free"),
    HELD: _("held"),
    EXPIRED: _("expired, not released"),
    OVERDUE: _("heartbeat overdue"),
}
STATE_COLOURS = {FREE: "#6b7280", HELD: "#15803d", EXPIRED: "#b91c1c", OVERDUE: "#c2410c"}
STATUS_COLOURS = {
    RunStatus.RUNNING: "#1d4ed8",
    RunStatus.SUCCEEDED: "#15803d",
    RunStatus.FAILED: "#b91c1c",
    RunStatus.LOST_LOCK: "#c2410c",
    RunStatus.RELEASED: "#6b7280",
}
# The counts a job usually reports (DESIGN, JobRun), shown in this order.
STATS_ORDER = ("fetched", "created", "updated", "unchanged", "invalid", "removed", "pruned")
RECENT_RUNS = 20
ERROR_EXCERPT = 80


# --- formatting ----------------------------------------------------------------


def span(delta: timedelta) -> str:
    """A short length of time: "42 s", "4 min", "2 h 5 min", "3 h", "3 d 4 h" (floored)."""
    seconds = int(abs(delta.total_seconds()))
    if seconds < 60:
        return gettext("%(s)d s") % {"s": seconds}
    minutes = seconds // 60
    if minutes < 60:
        return gettext("%(m)d min") % {"m": minutes}
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        if not minutes:
            return gettext("%(h)d h") % {"h": hours}
        return gettext("%(h)d h %(m)d min") % {"h": hours, "m": minutes}
    days, hours = divmod(hours, 24)
    if not hours:
        return gettext("%(d)d d") % {"d": days}
    return gettext("%(d)d d %(h)d h") % {"d": days, "h": hours}


def relative(when: datetime, *, now: datetime) -> str:
    """ "in 4 min" or "3 min ago", against ``now`` (the database clock)."""
    if when >= now:
        return gettext("in %(span)s") % {"span": span(when - now)}
    return gettext("%(span)s ago") % {"span": span(now - when)}


def duration(delta: timedelta | None) -> str:
    if delta is None or delta < timedelta(0):
        return "—"
    if delta < timedelta(minutes=1):
        return gettext("%(s).1f s") % {"s": delta.total_seconds()}
    return span(delta)


def absolute(when: datetime | None) -> str:
    if when is None:
        return "—"
    return date_format(timezone.localtime(when), "Y-m-d H:i:s T")


def nowrap(text: str) -> str:
    return format_html('<span style="white-space:nowrap">{}</span>', text)


def stacked(main: str, detail: str) -> str:
    """A relative time over its absolute one."""
    return format_html('{}<br><small style="white-space:nowrap">{}</small>', main, detail)


def timestamp(field: str, description: str):
    """A list column showing ``field`` as "2026-11-30 14:00:00 UTC", sortable."""

    @admin.display(description=description, ordering=field)
    def show(self, obj) -> str:
        return nowrap(absolute(getattr(obj, field)))

    return show


def badge(text: str, colour: str, title: str = "") -> str:
    return format_html(
        '<span class="lock-badge" title="{}" style="display:inline-block;padding:1px 8px;'
        'border-radius:9px;color:#fff;background:{};font-weight:600;white-space:nowrap">{}</span>',
        title,
        colour,
        text,
    )


def status_badge(status: str) -> str:
    if not status:
        return "—"
    return badge(RunStatus(status).label, STATUS_COLOURS.get(status, "#6b7280"))


def _state_of(lock: SyncLock) -> str:
    return lock_state(locked_until=lock.locked_until, heartbeat_at=lock.heartbeat_at, db_now=lock.db_now)


# --- the summary line above the locks list ----------------------------------------------


@dataclass(frozen=True)
class ScheduledJob:
    job: str
    last_success: datetime | None
    last_success_age: str
    next_tick: datetime | None
    next_tick_in: str
    error: str = ""


@dataclass(frozen=True)
class Summary:
    jobs: list[ScheduledJob]
    stuck: int
    db_now: datetime | None


def lock_summary() -> Summary:
    """Last success and next tick of each job in ``LOCKS_SCHEDULES``, and the
    number of stuck locks; one query for the locks plus one per scheduled job."""
    held = list(
        SyncLock.objects.filter(locked_until__isnull=False)
        .annotate(db_now=Now())
        .values_list("locked_until", "heartbeat_at", "db_now")
    )
    stuck = sum(
        lock_state(locked_until=until, heartbeat_at=beat, db_now=now) in STUCK for until, beat, now in held
    )
    db_now = held[0][2] if held else None
    jobs = []
    for job, expression in getattr(settings, "LOCKS_SCHEDULES", {}).items():
        last = (
            JobRun.objects.for_job(job)
            .succeeded()
            .annotate(db_now=Now())
            .order_by("-started_at")
            .values_list("finished_at", "db_now")
            .first()
        )
        if last is not None:
            db_now = last[1]
        now = db_now or timezone.now()
        finished = last[0] if last else None
        if not is_valid_expression(expression):
            error = gettext("schedule %(expression)r is not a valid cron expression") % {
                "expression": expression
            }
            jobs.append(ScheduledJob(job, finished, _age(finished, now), None, "", error))
            continue
        upcoming = next_tick(expression, now=now)
        jobs.append(ScheduledJob(job, finished, _age(finished, now), upcoming, relative(upcoming, now=now)))
    return Summary(jobs=jobs, stuck=stuck, db_now=db_now)


def _age(when: datetime | None, now: datetime) -> str:
    return relative(when, now=now) if when else ""


# --- filters ---------------------------------------------------------------------


class LockStateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [*STATE_LABELS.items(), ("stuck", _("stuck (expired or heartbeat overdue)"))]

    def queryset(self, request, queryset):
        if self.value() is None:
            return queryset
        wanted = set(STUCK) if self.value() == "stuck" else {self.value()}
        if wanted == {FREE}:
            return queryset.filter(locked_until__isnull=True)
        # "Heartbeat overdue" needs arithmetic on two columns and the clock;
        # lock rows are one per job, so read their lease fields and pick.
        rows = SyncLock.objects.filter(locked_until__isnull=False).annotate(db_now=Now())
        pks = [
            pk
            for pk, until, beat, now in rows.values_list("pk", "locked_until", "heartbeat_at", "db_now")
            if lock_state(locked_until=until, heartbeat_at=beat, db_now=now) in wanted
        ]
        return queryset.filter(pk__in=pks)


# --- locks ------------------------------------------------------------------------


class ReadOnlyAdminMixin:
    """For rows that machines write: nobody adds, edits or deletes them here."""

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(SyncLock)
class SyncLockAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    empty_value_display = "—"
    list_display = (
        "job_name",
        "state",
        "lock_holder",
        "token",
        "lease",
        "tick_at",
        "last_run",
        "last_finished",
        "last_duration",
    )
    list_display_links = ("job_name",)
    list_filter = (LockStateFilter, "last_status")
    search_fields = ("job_name", "holder")
    actions = ("force_release",)
    fieldsets = (
        (
            _("Lease"),
            {"fields": ("job_name", "state", "holder", "token", "lease", "acquired", "heartbeat", "tick_at")},
        ),
        (
            _("Last run"),
            {"fields": ("last_run", "last_started", "last_finished", "last_duration", "last_error")},
        ),
    )
    readonly_fields = (
        "job_name",
        "state",
        "holder",
        "token",
        "lease",
        "acquired",
        "heartbeat",
        "tick_at",
        "last_run",
        "last_started",
        "last_finished",
        "last_duration",
        "last_error",
    )

    # Rows are written by the lock API only; deleting one would restart its
    # fencing token at 1, so nobody may add, edit or delete them here.

    def has_force_release_permission(self, request: HttpRequest, obj: SyncLock | None = None) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.force_release_synclock")

    def get_queryset(self, request: HttpRequest):
        return super().get_queryset(request).annotate(db_now=Now())

    # --- columns

    tick_at = timestamp("tick", _("tick"))
    acquired = timestamp("acquired_at", _("acquired"))
    last_started = timestamp("last_started_at", _("last started"))

    @admin.display(description=_("holder"), ordering="holder")
    def lock_holder(self, lock: SyncLock) -> str:
        return nowrap(lock.holder) if lock.holder else "—"

    @admin.display(description=_("state"), ordering="locked_until")
    def state(self, lock: SyncLock) -> str:
        state = _state_of(lock)
        title = ""
        if lock.heartbeat_at is not None and state != FREE:
            title = gettext("last heartbeat %(when)s") % {
                "when": relative(lock.heartbeat_at, now=lock.db_now)
            }
        return badge(STATE_LABELS[state], STATE_COLOURS[state], title)

    @admin.display(description=_("locked until"), ordering="locked_until")
    def lease(self, lock: SyncLock) -> str:
        if lock.locked_until is None:
            return gettext("released")
        if lock.locked_until < lock.db_now:
            text = gettext("expired %(span)s ago") % {"span": span(lock.db_now - lock.locked_until)}
        else:
            text = relative(lock.locked_until, now=lock.db_now)
        return stacked(
            format_html('<span class="lock-relative">{}</span>', text), absolute(lock.locked_until)
        )

    @admin.display(description=_("last heartbeat"), ordering="heartbeat_at")
    def heartbeat(self, lock: SyncLock) -> str:
        if lock.heartbeat_at is None:
            return "—"
        return stacked(relative(lock.heartbeat_at, now=lock.db_now), absolute(lock.heartbeat_at))

    @admin.display(description=_("last run"), ordering="last_status")
    def last_run(self, lock: SyncLock) -> str:
        return status_badge(lock.last_status)

    @admin.display(description=_("last finished"), ordering="last_finished_at")
    def last_finished(self, lock: SyncLock) -> str:
        if lock.last_finished_at is None:
            return "—"
        return stacked(relative(lock.last_finished_at, now=lock.db_now), absolute(lock.last_finished_at))

    @admin.display(description=_("last duration"))
    def last_duration(self, lock: SyncLock) -> str:
        if lock.last_status == RunStatus.RUNNING and lock.last_started_at is not None:
            if _state_of(lock) == EXPIRED:
                return gettext("did not finish")
            return gettext("running for %(span)s") % {"span": span(lock.db_now - lock.last_started_at)}
        if lock.last_started_at is None or lock.last_finished_at is None:
            return "—"
        return duration(lock.last_finished_at - lock.last_started_at)

    # --- pages

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        extra_context = {**(extra_context or {}), "lock_summary": lock_summary()}
        return super().changelist_view(request, extra_context)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict | None = None
    ) -> HttpResponse:
        extra_context = dict(extra_context or {})
        lock = self.get_object(request, unquote(object_id))
        if lock is not None:
            runs = list(JobRun.objects.for_job(lock.job_name).order_by("-started_at")[:RECENT_RUNS])
            extra_context.update(
                recent_runs=[_run_row(run) for run in runs],
                runs_url=reverse("admin:locks_jobrun_changelist")
                + "?"
                + urlencode({"job_name": lock.job_name}),
                can_force_release=(
                    lock.locked_until is not None and self.has_force_release_permission(request, lock)
                ),
                force_release_url=reverse("admin:locks_synclock_force_release", args=[lock.pk]),
            )
        return super().change_view(request, object_id, form_url, extra_context)

    def get_urls(self):
        view = self.admin_site.admin_view(self.force_release_view)
        return [
            path("<path:object_id>/force-release/", view, name="locks_synclock_force_release"),
            *super().get_urls(),
        ]

    # --- force release: the action and the button share the confirmation page

    @admin.action(description=_("Force-release the selected locks"), permissions=["force_release"])
    def force_release(self, request: HttpRequest, queryset) -> HttpResponse | None:
        if request.POST.get("post") == "yes":
            self._release(request, list(queryset))
            return None  # back to the list, with the messages
        return self._confirm(request, list(queryset), action=True)

    def force_release_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        lock = self.get_object(request, unquote(object_id))
        if lock is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not self.has_force_release_permission(request, lock):
            raise PermissionDenied
        if request.method == "POST":
            self._release(request, [lock])
            return HttpResponseRedirect(reverse("admin:locks_synclock_changelist"))
        return self._confirm(request, [lock], action=False)

    def _confirm(self, request: HttpRequest, locks: list[SyncLock], *, action: bool) -> TemplateResponse:
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Force-release job locks?"),
            "opts": self.opts,
            "locks": [
                {
                    "lock": lock,
                    "state": self.state(lock),
                    "lease": self.lease(lock),
                    "held": lock.locked_until is not None,
                }
                for lock in locks
            ],
            "action": action,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        return TemplateResponse(request, "admin/locks/synclock/force_release_confirmation.html", context)

    def _release(self, request: HttpRequest, locks: list[SyncLock]) -> None:
        by = f"admin user {request.user.get_username()}"
        for lock in locks:
            try:
                result = api.force_release(job=lock.job_name, by=by)
            except (api.UnknownJob, api.LockError) as exc:
                self.message_user(request, str(exc), messages.ERROR)
                continue
            values = {
                "job": result.job,
                "holder": result.previous_holder or "—",
                "old": result.previous_token,
                "new": result.token,
            }
            if not result.was_held:
                self.message_user(
                    request, gettext("Nothing to release: %(job)s was not held.") % values, messages.WARNING
                )
                continue
            self.log_change(
                request,
                lock,
                gettext("Force-released; previous holder %(holder)s (token %(old)s), new token %(new)s.")
                % values,
            )
            self.message_user(
                request,
                gettext(
                    "Released %(job)s: holder was %(holder)s (token %(old)s); new token %(new)s. "
                    "The old holder can no longer renew or release it."
                )
                % values,
                messages.SUCCESS,
            )


# --- run history ----------------------------------------------------------------------


def counts(stats: dict, *, zeros: bool = True) -> str:
    """ "fetched 1758 · created 3 · …"; without ``zeros``, only what is not 0 (and always fetched).

    The JSON column does not keep key order (PostgreSQL's jsonb sorts keys),
    so the usual keys come first in a fixed order, then any others by name.
    """
    stats = stats or {}
    keys = sorted(
        stats, key=lambda key: (STATS_ORDER.index(key) if key in STATS_ORDER else len(STATS_ORDER), key)
    )
    return format_html_join(
        " · ",
        '<span style="white-space:nowrap">{} {}</span>',
        (
            (key, stats[key])
            for key in keys
            if not isinstance(stats[key], dict) and (zeros or stats[key] or key == "fetched")
        ),
    )


def _run_row(run: JobRun) -> dict:
    return {
        "run": run,
        "status": status_badge(run.status),
        "duration": duration(run.duration),
        "counts": counts(run.stats),
        "error": _excerpt(run.error),
        "url": reverse("admin:locks_jobrun_change", args=[run.pk]),
    }


def _excerpt(text: str) -> str:
    text = " ".join(text.split())
    return text if len(text) <= ERROR_EXCERPT else text[: ERROR_EXCERPT - 1] + "…"


@admin.register(JobRun)
class JobRunAdmin(ReadOnlyAdminMixin, admin.ModelAdmin):
    empty_value_display = "—"
    list_display = (
        "job_name",
        "tick_at",
        "run_status",
        "run_holder",
        "started",
        "finished",
        "run_duration",
        "key_counts",
        "error_excerpt",
    )
    list_filter = ("job_name", "status", "started_at")
    date_hierarchy = "started_at"
    search_fields = ("job_name", "holder", "error")
    fields = (
        "job_name",
        "tick_at",
        "run_status",
        "holder",
        "token",
        "started",
        "finished",
        "run_duration",
        "key_counts",
        "error",
    )
    readonly_fields = fields

    # Written by the lock's bookkeeping; pruned after LOCKS_RUN_RETENTION_DAYS.

    started = timestamp("started_at", _("started"))
    finished = timestamp("finished_at", _("finished"))

    @admin.display(description=_("tick"), ordering="tick")
    def tick_at(self, run: JobRun) -> str:
        return nowrap(absolute(run.tick)) if run.tick else gettext("forced")

    @admin.display(description=_("holder"), ordering="holder")
    def run_holder(self, run: JobRun) -> str:
        return nowrap(run.holder)

    @admin.display(description=_("status"), ordering="status")
    def run_status(self, run: JobRun) -> str:
        return status_badge(run.status)

    @admin.display(description=_("duration"))
    def run_duration(self, run: JobRun) -> str:
        return duration(run.duration)

    @admin.display(description=_("counts"))
    def key_counts(self, run: JobRun) -> str:
        return counts(run.stats, zeros=False) or "—"

    @admin.display(description=_("error"))
    def error_excerpt(self, run: JobRun) -> str:
        if not run.error:
            return "—"
        return format_html('<span title="{}">{}</span>', run.error[:1000], _excerpt(run.error))
