"""Admin of job locks, runs, pauses and incidents. Rows are machine-written: read-only here. The operator's writes (force release, reset tick, pause, resume, run now) are actions and buttons that call ``locks.operator``, each confirmed first where it can harm, permission-gated and logged (``LogEntry``). Every state and relative time is judged against the database clock (``db_now``)."""

from __future__ import annotations

from datetime import datetime, timedelta
from urllib.parse import urlencode

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.formats import date_format
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator
from django.utils.timesince import timesince, timeuntil
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from locks.db import RowLocked
from locks.lease import LockError, iso
from locks.models import EXPIRED, FREE, HELD, OVERDUE, Incident, JobPause, JobRun, Outcome, SyncLock
from locks.operator import force_release, pause_job, reset_tick, resume_job, start_run_now
from locks.registry import UnknownJob, get_job, timezone_of
from locks.registry import jobs as registered_jobs
from locks.schedule import local_label
from locks.status import Ledger, job_ledgers, lock_summary

# --- from display.py ---

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
    return badge(Outcome(status).label, status)


def outcome_badge(outcome: str) -> str:
    """A tick ledger outcome (``locks.status``) as a badge."""
    return badge(gettext(outcome), f"tick-{outcome}")


def ledger_strip(ledger) -> str:
    """A ``locks.status.Ledger`` as a strip of cells, oldest left, newest right: one per slot,
    coloured by its outcome (locks/admin.css), the slot and outcome in its title."""
    cells = format_html_join(
        "",
        '<span class="tick-cell" data-outcome="{}" title="{}"></span>',
        ((slot.outcome, slot.describe(tz=ledger.timezone)) for slot in reversed(ledger.slots)),
    )
    return format_html('<span class="tick-strip" data-job="{}">{}</span>', ledger.job, cells)


def slot_time(when: datetime, job: str) -> str:
    """A slot in its job's zone with its abbreviation (``2027-03-28 03:00 CEST``), the UTC
    instant as its tooltip."""
    return format_html(
        '<span class="nowrap" title="{}">{}</span>', iso(when), local_label(when, tz=timezone_of(job))
    )


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


# --- from actions.py ---

SHOWN_INPUT = "shown-%s"  # the fencing token shown, one hidden input per lock
SHOWN_TICK_INPUT = "shown-tick-%s"  # the claimed tick shown (ISO 8601, empty: none), and
SHOWN_DONE_INPUT = "shown-done-%s"  # whether it was done (1 or 0): reset_tick's guard


class LeaseActionsMixin:
    """For ``SyncLockAdmin``: the actions, the detail page's button and its view."""

    def has_force_release_permission(self, request: HttpRequest, obj: SyncLock | None = None) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.force_release_synclock")

    def get_urls(self):
        view = self.admin_site.admin_view(self.force_release_view)
        return [
            path("<path:object_id>/force-release/", view, name="locks_synclock_force_release"),
            *super().get_urls(),
        ]

    @admin.action(description=_("Force-release the selected locks"), permissions=["force_release"])
    def force_release(self, request: HttpRequest, queryset) -> HttpResponse | None:
        if request.POST.get("post") == "yes":
            self._release(request, list(queryset))
            return None  # back to the list, with the messages
        return self._confirm(request, list(queryset), operation="force_release", action=True)

    @admin.action(description=_("Reset the claimed tick"), permissions=["force_release"])
    def reset_tick(self, request: HttpRequest, queryset) -> HttpResponse | None:
        if request.POST.get("post") == "yes":
            self._reset(request, list(queryset))
            return None
        return self._confirm(request, list(queryset), operation="reset_tick", action=True)

    def force_release_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        lock = self.get_object(request, unquote(object_id))
        if lock is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not self.has_force_release_permission(request, lock):
            raise PermissionDenied
        if request.method == "POST":
            self._release(request, [lock])
            return HttpResponseRedirect(reverse("admin:locks_synclock_changelist"))
        return self._confirm(request, [lock], operation="force_release", action=False)

    def _confirm(
        self, request: HttpRequest, locks: list[SyncLock], *, operation: str, action: bool
    ) -> TemplateResponse:
        titles = {
            "force_release": gettext("Force-release job locks?"),
            "reset_tick": gettext("Reset the claimed tick of job locks?"),
        }
        context = {
            **self.admin_site.each_context(request),
            "title": titles[operation],
            "operation": operation,
            "opts": self.opts,
            "locks": [
                {
                    "lock": lock,
                    "state": self.state(lock),
                    "lease": self.lease(lock),
                    "tick": self.tick_at(lock),
                    "token_field": SHOWN_INPUT % lock.pk,
                    "tick_field": SHOWN_TICK_INPUT % lock.pk,
                    "shown_tick": iso(lock.tick) or "",
                    "done_field": SHOWN_DONE_INPUT % lock.pk,
                    "shown_done": int(lock.tick_done),
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
                result = force_release(job=lock.job_name, expected_token=_shown_token(request, lock), by=by)
            except (UnknownJob, LockError, RowLocked) as exc:
                self.message_user(request, str(exc), messages.ERROR)
                continue
            values = {
                "job": result.job,
                "holder": result.previous_holder or "—",
                "old": result.previous_token,
                "new": result.token,
                "detail": result.detail,
            }
            if not result.was_held:
                if result.detail:
                    message = gettext("Nothing released: %(detail)s.") % values
                else:
                    message = gettext("Nothing to release: %(job)s was not held.") % values
                self.message_user(request, message, messages.WARNING)
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

    def _reset(self, request: HttpRequest, locks: list[SyncLock]) -> None:
        by = f"admin user {request.user.get_username()}"
        reset = untouched = 0
        for lock in locks:
            shown = _shown_tick(request, lock)
            if shown is None:
                message = gettext("Nothing reset for %(job)s: the request did not say which tick was shown.")
                self.message_user(request, message % {"job": lock.job_name}, messages.ERROR)
                continue
            try:
                result = reset_tick(
                    job=lock.job_name,
                    expected_tick=shown[0],
                    expected_done=shown[1],
                    expected_token=_shown_token(request, lock),
                    by=by,
                )
            except (UnknownJob, LockError, RowLocked) as exc:
                self.message_user(request, str(exc), messages.ERROR)
                continue
            if result.detail:
                self.message_user(
                    request,
                    gettext("Nothing reset: %(detail)s.") % {"detail": result.detail},
                    messages.WARNING,
                )
                continue
            if not result.was_reset:
                untouched += 1
                continue
            reset += 1
            state = gettext("done") if result.was_done else gettext("not done")
            self.log_change(
                request,
                lock,
                gettext("Reset the claimed tick; it was %(tick)s (%(state)s).")
                % {"tick": iso(result.previous_tick), "state": state},
            )
        if reset:
            message = ngettext(
                "Reset the claimed tick of %(count)d job lock: its next scheduled run may claim any tick.",
                "Reset the claimed tick of %(count)d job locks: their next scheduled runs may claim any tick.",
                reset,
            )
            self.message_user(request, message % {"count": reset}, messages.SUCCESS)
        if untouched:
            message = ngettext(
                "%(count)d job lock had no claimed tick; nothing to reset.",
                "%(count)d job locks had no claimed tick; nothing to reset.",
                untouched,
            )
            self.message_user(request, message % {"count": untouched}, messages.WARNING)


def _shown_tick(request: HttpRequest, lock: SyncLock) -> tuple[datetime | None, bool] | None:
    """The claimed tick, and whether it was done, that the confirmation page showed for
    ``lock``; None when the request does not carry them."""
    tick, done = request.POST.get(SHOWN_TICK_INPUT % lock.pk), request.POST.get(SHOWN_DONE_INPUT % lock.pk)
    if tick is None or done not in {"0", "1"}:
        return None
    try:
        return (datetime.fromisoformat(tick) if tick else None), done == "1"
    except ValueError:
        return None


def _shown_token(request: HttpRequest, lock: SyncLock) -> int | None:
    """The fencing token the confirmation page showed for ``lock``, if it sent one."""
    value = request.POST.get(SHOWN_INPUT % lock.pk)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return -1  # matches no lease: nothing is released, and the message says what is there now


# --- from controls.py ---

NOTE_FIELD = "note"


def admin_requester(request: HttpRequest) -> str:
    """``admin:<username>``: who paused a job or asked for a run, as runs and pauses record it."""
    return f"admin:{request.user.get_username()}"


class JobControlsMixin:
    """For ``SyncLockAdmin``: the pause, resume and run-now actions, buttons and views."""

    def has_pause_permission(self, request: HttpRequest, obj: SyncLock | None = None) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.pause_synclock")

    def has_run_permission(self, request: HttpRequest, obj: SyncLock | None = None) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.run_synclock")

    def get_urls(self):
        def view(function, name):
            return path(
                f"<path:object_id>/{name}/",
                self.admin_site.admin_view(function),
                name=f"locks_synclock_{name}",
            )

        return [
            view(self.pause_view, "pause"),
            view(self.resume_view, "resume"),
            view(self.run_now_view, "run_now"),
            *super().get_urls(),
        ]

    # --- list actions

    @admin.action(description=_("Pause the selected jobs"), permissions=["pause"])
    def pause_jobs(self, request: HttpRequest, queryset) -> HttpResponse | None:
        if request.POST.get("post") == "yes":
            self._pause(request, list(queryset), note=request.POST.get(NOTE_FIELD, ""))
            return None
        return self._pause_form(request, list(queryset), action=True)

    @admin.action(description=_("Resume the selected jobs"), permissions=["pause"])
    def resume_jobs(self, request: HttpRequest, queryset) -> None:
        self._resume(request, list(queryset))

    @admin.action(description=_("Run the selected jobs now"), permissions=["run"])
    def run_now(self, request: HttpRequest, queryset) -> None:
        for lock in queryset:  # with_state(): SyncLockAdmin.get_queryset
            self._run_now(request, lock)

    # --- the buttons' views

    def _lock_for(self, request: HttpRequest, object_id: str, allowed) -> SyncLock | HttpResponse:
        lock = self.get_queryset(request).filter(pk=unquote(object_id)).first()
        if lock is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not allowed(request, lock):
            raise PermissionDenied
        return lock

    def _back(self, lock: SyncLock) -> HttpResponseRedirect:
        return HttpResponseRedirect(reverse("admin:locks_synclock_change", args=[lock.pk]))

    def pause_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        lock = self._lock_for(request, object_id, self.has_pause_permission)
        if isinstance(lock, HttpResponse):
            return lock
        if request.method == "POST":
            self._pause(request, [lock], note=request.POST.get(NOTE_FIELD, ""))
            return self._back(lock)
        return self._pause_form(request, [lock], action=False)

    def resume_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._post_only(
            request, object_id, self.has_pause_permission, lambda lock: self._resume(request, [lock])
        )

    def run_now_view(self, request: HttpRequest, object_id: str) -> HttpResponse:
        return self._post_only(
            request, object_id, self.has_run_permission, lambda lock: self._run_now(request, lock)
        )

    def _post_only(self, request: HttpRequest, object_id: str, allowed, act) -> HttpResponse:
        """A button's view: POST only, with its permission, then back to the lock's page."""
        if request.method != "POST":
            return HttpResponseNotAllowed(["POST"])
        lock = self._lock_for(request, object_id, allowed)
        if isinstance(lock, HttpResponse):
            return lock
        act(lock)
        return self._back(lock)

    # --- what they do

    def _pause_form(self, request: HttpRequest, locks: list[SyncLock], *, action: bool) -> TemplateResponse:
        context = {
            **self.admin_site.each_context(request),
            "title": gettext("Pause jobs?"),
            "opts": self.opts,
            "locks": locks,
            "action": action,
            "note_field": NOTE_FIELD,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        return TemplateResponse(request, "admin/locks/synclock/pause_confirmation.html", context)

    def _pause(self, request: HttpRequest, locks: list[SyncLock], *, note: str) -> None:
        for lock in locks:
            try:
                state = pause_job(job=lock.job_name, by=admin_requester(request), note=note)
            except UnknownJob as exc:
                self.message_user(request, str(exc), messages.ERROR)
                continue
            if not state.changed:
                self.message_user(
                    request, gettext("Already paused: %s.") % state.describe(), messages.WARNING
                )
                continue
            self.log_change(request, lock, gettext("Paused: %s") % (state.paused_note or gettext("no note")))
            self.message_user(
                request,
                gettext(
                    "Paused %(job)s: no copy runs it (cron, scheduler, run_job, --force, trigger) until it is resumed."
                )
                % {"job": lock.job_name},
                messages.SUCCESS,
            )

    def _resume(self, request: HttpRequest, locks: list[SyncLock]) -> None:
        for lock in locks:
            try:
                state = resume_job(job=lock.job_name, by=admin_requester(request))
            except UnknownJob as exc:
                self.message_user(request, str(exc), messages.ERROR)
                continue
            if not state.changed:
                self.message_user(request, gettext("Not paused: %s.") % lock.job_name, messages.WARNING)
                continue
            self.log_change(request, lock, gettext("Resumed."))
            self.message_user(
                request,
                gettext("Resumed %(job)s: its next slot runs as usual.") % {"job": lock.job_name},
                messages.SUCCESS,
            )

    def _run_now(self, request: HttpRequest, lock: SyncLock) -> None:
        """Start the run in the background, unless the lock says now that it would only skip."""
        values = {
            "job": lock.job_name,
            "by": lock.paused_by,
            "since": iso(lock.paused_at),
            "holder": lock.holder,
        }
        try:
            get_job(lock.job_name)
        except UnknownJob as exc:
            self.message_user(request, str(exc), messages.ERROR)
            return
        if lock.paused_at is not None:
            message = gettext(
                "%(job)s is paused by %(by)s since %(since)s: resume it first; nothing started."
            )
            self.message_user(request, message % values, messages.WARNING)
            return
        if lock.state in {"held", "heartbeat overdue"}:
            values["until"] = iso(lock.locked_until)
            message = gettext("%(job)s is running now (held by %(holder)s until %(until)s); nothing started.")
            self.message_user(request, message % values, messages.WARNING)
            return
        try:
            values["pid"] = start_run_now(job=lock.job_name, requested_by=admin_requester(request))
        except OSError as exc:
            self.message_user(
                request,
                gettext("Could not start %(job)s: %(error)s") % {**values, "error": exc},
                messages.ERROR,
            )
            return
        self.log_change(request, lock, gettext("Run now requested (background process %(pid)s).") % values)
        self.message_user(
            request,
            gettext(
                "Started a run of %(job)s in the background (pid %(pid)s): it runs under the lease; "
                "its outcome appears in the run history."
            )
            % values,
            messages.SUCCESS,
        )


# --- from admin.py ---

RECENT_RUNS = 20


class Styled:
    """The badges (``locks.admin.badge``) and layout of locks/static/locks/admin.css; an
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
        return stacked(slot_time(lock.tick, lock.job_name), tick_progress(lock))

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
        if lock.last_status == Outcome.RUNNING and lock.last_started_at is not None:
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
                ledger_rows=[
                    {
                        "slot": slot,
                        "badge": outcome_badge(slot.outcome),
                        "at": slot_time(slot.tick, lock.job_name),
                    }
                    for slot in ledger.slots
                ]
                if ledger
                else [],
                next_slots=[(slot_time(s.slot, lock.job_name), s.dst) for s in _next_five(lock.job_name)],
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


def _next_five(job: str) -> list:
    try:
        return get_job(job).next_slots(count=5)
    except (UnknownJob, ImproperlyConfigured):  # a lock row of a job no longer registered
        return []


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


# --- incidents and pauses (check_jobs and locks.operator write them) ------------------------


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
