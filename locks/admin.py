"""Admin for job locks and their run history.

Lock and run rows are written only by ``locks.leases``: here they are read-only.
The two writes, force release and reset of the claimed tick, and their actions live in
``locks.operations`` (the same services as ``manage.py locks release``).
``ReadOnlyAdminMixin`` and ``Styled`` (with ``locks.display.badge``) are for other apps'
admins of machine-written rows too.
Every state and relative time is computed against the database clock
(``db_now``, annotated on the queryset), never this host's clock.
"""

from __future__ import annotations

from urllib.parse import urlencode

from django.contrib import admin
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ImproperlyConfigured
from django.http import HttpRequest, HttpResponse
from django.urls import reverse
from django.utils.html import format_html
from django.utils.timesince import timesince, timeuntil
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from locks.actions import LeaseActionsMixin
from locks.controls import JobControlsMixin
from locks.display import (
    STATE_LABELS,
    absolute,
    ago,
    counts,
    duration,
    excerpt,
    ledger_strip,
    nowrap,
    outcome_badge,
    stacked,
    state_badge,
    status_badge,
    tick_progress,
)
from locks.ledger import Ledger, job_ledgers
from locks.models import EXPIRED, HELD, OVERDUE, Incident, JobPause, JobRun, RunStatus, SyncLock
from locks.registry import jobs as registered_jobs
from locks.selectors import lock_summary

RECENT_RUNS = 20


class Styled:
    """The badges (``locks.display.badge``) and layout of locks/static/locks/admin.css; an
    app's own badge kinds go in a stylesheet of its own, added by its admin's ``Media``."""

    class Media:
        css = {"all": ["locks/admin.css"]}


def timestamp(field: str, description: str):
    """A list column showing ``field`` as "2026-11-30 14:00:00 UTC", sortable."""

    @admin.display(description=description, ordering=field)
    def show(self, obj) -> str:
        return nowrap(absolute(getattr(obj, field)))

    return show


# --- filters ---------------------------------------------------------------------


class LockStateFilter(admin.SimpleListFilter):
    title = _("state")
    parameter_name = "state"

    def lookups(self, request, model_admin):
        return [*STATE_LABELS.items(), ("stuck", _("stuck (expired or heartbeat overdue)"))]

    def queryset(self, request, queryset):
        if self.value() is None:
            return queryset
        if self.value() == "stuck":
            return queryset.stuck()
        return queryset.with_state().filter(state=self.value())


# --- locks ------------------------------------------------------------------------


def ledgers_for(names: list[str]) -> dict[str, Ledger]:
    """The tick ledgers of those of ``names`` that are registered jobs; four queries."""
    try:
        registered = registered_jobs()
    except ImproperlyConfigured:  # the summary line says why
        return {}
    return job_ledgers(jobs=[registered[name] for name in names if name in registered])


class LockChangeList(ChangeList):
    """The locks list, with each registered job's tick ledger on its row (``ticks`` column), read
    for the whole page at once."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_list = list(self.result_list)
        ledgers = ledgers_for([lock.job_name for lock in self.result_list])
        for lock in self.result_list:
            lock.ledger = ledgers.get(lock.job_name)


class ReadOnlyAdminMixin:
    """For rows that machines write: nobody adds, edits or deletes them here (deleting a
    lock row would restart its fencing token at 1)."""

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_change_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    def has_delete_permission(self, request: HttpRequest, obj=None) -> bool:
        return False


@admin.register(SyncLock)
class SyncLockAdmin(JobControlsMixin, LeaseActionsMixin, ReadOnlyAdminMixin, Styled, admin.ModelAdmin):
    empty_value_display = "—"
    list_display = (
        "job_name",
        "ticks",
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
    actions = ("run_now", "pause_jobs", "resume_jobs", "force_release", "reset_tick")
    fieldsets = (
        (
            _("Lease"),
            {"fields": ("job_name", "state", "holder", "token", "lease", "acquired", "heartbeat", "tick_at")},
        ),
        (
            _("Last run"),
            {"fields": ("last_run", "last_started", "last_finished", "last_duration", "last_error")},
        ),
        (_("Pause"), {"fields": ("pause",)}),
    )
    readonly_fields = [name for _title, section in fieldsets for name in section["fields"]]

    def get_queryset(self, request: HttpRequest):
        return super().get_queryset(request).with_state()

    def get_changelist(self, request: HttpRequest, **kwargs):
        return LockChangeList

    # --- columns

    acquired = timestamp("acquired_at", _("acquired"))
    last_started = timestamp("last_started_at", _("last started"))

    @admin.display(description=_("tick"), ordering="tick")
    def tick_at(self, lock: SyncLock) -> str:
        if lock.tick is None:
            return "—"
        return stacked(nowrap(absolute(lock.tick)), tick_progress(lock))

    @admin.display(description=_("ticks (newest right)"))
    def ticks(self, lock: SyncLock) -> str:
        ledger = getattr(lock, "ledger", None)
        return ledger_strip(ledger) if ledger is not None else "—"

    @admin.display(description=_("paused"))
    def pause(self, lock: SyncLock) -> str:
        if lock.paused_at is None:
            return gettext("not paused")
        note = f": {lock.paused_note}" if lock.paused_note else ""
        return gettext("paused by %(by)s since %(since)s%(note)s") % {
            "by": lock.paused_by,
            "since": absolute(lock.paused_at),
            "note": note,
        }

    @admin.display(description=_("holder"), ordering="holder")
    def lock_holder(self, lock: SyncLock) -> str:
        return nowrap(lock.holder) if lock.holder else "—"

    @admin.display(description=_("state"), ordering="locked_until")
    def state(self, lock: SyncLock) -> str:
        if lock.paused_at is not None:
            return format_html("{}<br>{}", state_badge(lock), outcome_badge("paused"))
        return state_badge(lock)

    @admin.display(description=_("locked until"), ordering="locked_until")
    def lease(self, lock: SyncLock) -> str:
        if lock.locked_until is None:
            return gettext("released")
        if lock.locked_until < lock.db_now:
            text = gettext("expired %(time)s ago") % {"time": timesince(lock.locked_until, lock.db_now)}
        else:
            text = gettext("in %(time)s") % {"time": timeuntil(lock.locked_until, lock.db_now)}
        return stacked(text, absolute(lock.locked_until))

    @admin.display(description=_("last heartbeat"), ordering="heartbeat_at")
    def heartbeat(self, lock: SyncLock) -> str:
        if lock.heartbeat_at is None:
            return "—"
        return stacked(ago(lock.heartbeat_at, now=lock.db_now), absolute(lock.heartbeat_at))

    @admin.display(description=_("last run"), ordering="last_status")
    def last_run(self, lock: SyncLock) -> str:
        return status_badge(lock.last_status)

    @admin.display(description=_("last finished"), ordering="last_finished_at")
    def last_finished(self, lock: SyncLock) -> str:
        if lock.last_finished_at is None:
            return "—"
        return stacked(ago(lock.last_finished_at, now=lock.db_now), absolute(lock.last_finished_at))

    @admin.display(description=_("last duration"))
    def last_duration(self, lock: SyncLock) -> str:
        if lock.last_status == RunStatus.RUNNING and lock.last_started_at is not None:
            if lock.state == EXPIRED:
                return gettext("did not finish")
            return gettext("running for %(time)s") % {"time": timesince(lock.last_started_at, lock.db_now)}
        return duration(lock.last_started_at, lock.last_finished_at)

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
            ledger = ledgers_for([lock.job_name]).get(lock.job_name)
            urls = {
                name: reverse(f"admin:locks_synclock_{name}", args=[lock.pk])
                for name in ("pause", "resume", "run_now")
            }
            extra_context.update(
                ledger=ledger,
                ledger_strip=ledger_strip(ledger) if ledger is not None else "",
                ledger_rows=[{"slot": slot, "badge": outcome_badge(slot.outcome)} for slot in ledger.slots]
                if ledger
                else [],
                paused=lock.paused_at is not None,
                can_pause=self.has_pause_permission(request, lock),
                can_run=self.has_run_permission(request, lock) and ledger is not None,
                control_urls=urls,
                recent_runs=[_run_row(run) for run in runs],
                runs_url=reverse("admin:locks_jobrun_changelist")
                + "?"
                + urlencode({"job_name": lock.job_name}),
                can_force_release=(
                    lock.state in {HELD, OVERDUE} and self.has_force_release_permission(request, lock)
                ),
                force_release_url=reverse("admin:locks_synclock_force_release", args=[lock.pk]),
            )
        return super().change_view(request, object_id, form_url, extra_context)


# --- run history ----------------------------------------------------------------------


def _run_row(run: JobRun) -> dict:
    return {
        "run": run,
        "status": status_badge(run.status),
        "duration": duration(run.started_at, run.finished_at),
        "counts": counts(run.stats),
        "error": excerpt(run.error),
        "url": reverse("admin:locks_jobrun_change", args=[run.pk]),
    }


@admin.register(JobRun)
class JobRunAdmin(ReadOnlyAdminMixin, Styled, admin.ModelAdmin):
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
        "requested_by",
        "error_excerpt",
    )
    list_filter = ("job_name", "status", "requested_by", "started_at")
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
        "requested_by",
        "error",
        "run_traceback",
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
        return duration(run.started_at, run.finished_at)

    @admin.display(description=_("counts"))
    def key_counts(self, run: JobRun) -> str:
        return counts(run.stats, zeros=False) or "—"

    @admin.display(description=_("traceback"))
    def run_traceback(self, run: JobRun) -> str:
        if not run.traceback:
            return gettext("none: it succeeded, or failed the way its job expects (the error says how)")
        return format_html('<pre class="run-traceback">{}</pre>', run.traceback)

    @admin.display(description=_("error"))
    def error_excerpt(self, run: JobRun) -> str:
        if not run.error:
            return "—"
        return format_html('<span title="{}">{}</span>', run.error[:1000], excerpt(run.error))


# --- incidents and pauses (check_jobs and locks.pausing write them) ------------------------


@admin.register(Incident)
class IncidentAdmin(ReadOnlyAdminMixin, Styled, admin.ModelAdmin):
    empty_value_display = "—"
    list_display = ("job_name", "reason", "summary", "opened", "closed", "opened_mail_at", "closed_mail_at")
    list_filter = ("job_name", "reason", ("closed_at", admin.EmptyFieldListFilter))
    search_fields = ("job_name", "summary", "last_error")
    fields = (*list_display, "last_error")
    readonly_fields = fields
    opened = timestamp("opened_at", _("opened"))
    closed = timestamp("closed_at", _("closed"))


@admin.register(JobPause)
class JobPauseAdmin(ReadOnlyAdminMixin, Styled, admin.ModelAdmin):
    empty_value_display = "—"
    list_display = ("job_name", "paused", "paused_by", "note", "resumed", "resumed_by")
    list_filter = ("job_name",)
    fields = list_display
    readonly_fields = fields
    paused = timestamp("paused_at", _("paused"))
    resumed = timestamp("resumed_at", _("resumed"))
