"""Admin of job locks, runs, claimed ticks and pauses (read-only rows) and the operator's writes as actions
and buttons: confirmed, permission-gated, logged; times on the database clock (docs/admin.md)."""

from __future__ import annotations

import contextlib
import functools
from collections import namedtuple
from datetime import datetime, timedelta
from urllib.parse import urlencode
from zoneinfo import ZoneInfo

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.contrib.admin.views.main import ChangeList
from django.core.exceptions import ImproperlyConfigured, PermissionDenied
from django.db.models import OuterRef, Subquery
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed
from django.shortcuts import redirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils import timezone
from django.utils.html import format_html, format_html_join
from django.utils.text import Truncator
from django.utils.timesince import timesince, timeuntil
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from locks.db import RowLocked
from locks.lease import LockError, iso
from locks.models import CLAIMED, EXPIRED, FREE, HELD, OVERDUE, JobPause, JobRun, Outcome, SyncLock, Tick
from locks.operator import admin_name, force_release, pause_job, reset_tick, resume_job, run_now
from locks.registry import UnknownJob, get_job, timezone_of
from locks.registry import jobs as registered_jobs
from locks.status import Ledger, job_ledgers, lock_summary

STATE_LABELS = {
    FREE: _("free"),
    HELD: _("held"),
    EXPIRED: _("expired, not released"),
    OVERDUE: _("heartbeat overdue"),
}
ERROR_EXCERPT = 80
RECENT_RUNS = 20


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


def absolute(when: datetime | None, zone: str | None = None) -> str:
    """ "2026-12-02 03:00:00 UTC", in ``zone`` (a job's page: the job's), else in ``TIME_ZONE``."""
    if when is None:
        return "—"
    local = when.astimezone(ZoneInfo(zone)) if zone else timezone.localtime(when)
    return local.strftime("%Y-%m-%d %H:%M:%S %Z")  # Django's "T" is empty in a repeated hour


def zone_of(obj) -> str | None:
    """The zone a lock's page shows its times in (``SyncLockAdmin.get_object``); None on a list."""
    return getattr(obj, "shown_zone", None)


def nowrap(text: str) -> str:
    return format_html('<span class="nowrap">{}</span>', text)


def stacked(main: str, detail: str) -> str:
    """A relative time over its absolute one."""
    return format_html('{}<br><small class="nowrap">{}</small>', main, detail)


def badge(text: str, kind: str, title: str = "") -> str:
    return format_html('<span class="lock-badge" data-kind="{}" title="{}">{}</span>', kind, title, text)


def status_badge(status: str) -> str:
    return badge(Outcome(status).label, status) if status else "—"


def outcome_badge(outcome: str) -> str:
    """A tick ledger outcome (``locks.status``) as a badge."""
    return badge(gettext(outcome), f"tick-{outcome}")


def ledger_strip(ledger) -> str:
    """A ``Ledger`` as cells, oldest left, coloured by outcome, outlined where a failover touched it."""
    cell = '<span class="tick-cell" data-outcome="{}" data-failover="{}" title="{}"></span>'
    slots = [(s.outcome, "yes" if s.failover else "no", s.describe(tz=ledger.timezone)) for s in ledger.slots]
    cells = format_html_join("", cell, reversed(slots))
    return format_html('<span class="tick-strip" data-job="{}">{}</span>', ledger.job, cells)


def slot_time(when: datetime, zone: str | None = None) -> str:
    """A slot as ``absolute`` shows it, the UTC instant as its tooltip."""
    return format_html('<span class="nowrap" title="{}">{}</span>', iso(when), absolute(when, zone))


def excerpt(text: str) -> str:
    return Truncator(" ".join(text.split())).chars(ERROR_EXCERPT)


def counts(stats: dict, *, zeros: bool = True) -> str:
    """ "created 3 · fetched 1758 · …", by name (jsonb keeps no key order); ``zeros``: the 0s too."""
    shown = [(k, v) for k, v in sorted((stats or {}).items()) if not isinstance(v, dict) and (zeros or v)]
    return format_html_join(" · ", '<span class="nowrap">{} {}</span>', shown)


# --- the operator's writes: actions, buttons, one confirmation page ---------------------------

SHOWN = {"token": "shown-%s", "tick": "shown-tick-%s", "done": "shown-done-%s"}  # what the page showed
NOTE_FIELD = "note"
# title: its confirmation page's (None: it does not ask first); segment: its button's URL on a lock's page.
Operation = namedtuple("Operation", "permission description title segment")
OPERATIONS = {  # in the order of the list's actions
    "run_now": Operation("run", _("Run the selected jobs now"), None, "run_now"),
    "pause_jobs": Operation("pause", _("Pause the selected jobs"), _("Pause jobs?"), "pause"),
    "resume_jobs": Operation("pause", _("Resume the selected jobs"), None, "resume"),
    "force_release": Operation(
        "force_release", _("Force-release the selected locks"), _("Force-release job locks?"), "force-release"
    ),
    "reset_tick": Operation(
        "force_release", _("Reset the claimed tick"), _("Reset the claimed tick of job locks?"), None
    ),
}


def _action(name: str):
    @admin.action(description=OPERATIONS[name].description, permissions=[OPERATIONS[name].permission])
    def act(modeladmin, request: HttpRequest, queryset) -> HttpResponse | None:
        return modeladmin.operate(request, list(queryset), name, action=True)

    act.__name__ = name
    return act


def _shown(request: HttpRequest, lock: SyncLock) -> dict:
    """What the confirmation page showed, as ``expected_*`` arguments (a bad token matches no lease)."""
    token, tick, done = (request.POST.get(SHOWN[key] % lock.pk) for key in ("token", "tick", "done"))
    try:
        shown = {"expected_token": int(token) if token is not None else None}
    except ValueError:
        shown = {"expected_token": -1}
    if tick is not None and done in {"0", "1"}:
        with contextlib.suppress(ValueError):
            shown.update(
                expected_tick=datetime.fromisoformat(tick) if tick else None, expected_done=done == "1"
            )
    return shown


def _permission(codename: str):
    def has_permission(self, request: HttpRequest, obj: SyncLock | None = None) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.{codename}_synclock")

    return has_permission


class OperatorAdminMixin:
    """For ``SyncLockAdmin``: each operator's write as a list action and a button on a lock's page."""

    has_force_release_permission = _permission("force_release")
    has_pause_permission = _permission("pause")
    has_run_permission = _permission("run")

    def get_urls(self):
        return [
            path(
                f"<path:object_id>/{row.segment}/",
                self.admin_site.admin_view(functools.partial(self.button_view, operation=operation)),
                name=f"locks_synclock_{row.segment.replace('-', '_')}",
            )
            for operation, row in OPERATIONS.items()
            if row.segment
        ] + super().get_urls()

    def button_view(self, request: HttpRequest, object_id: str, operation: str) -> HttpResponse:
        """GET: the confirmation page (where the operation asks first); POST: the operation."""
        if request.method != "POST" and OPERATIONS[operation].title is None:
            return HttpResponseNotAllowed(["POST"])
        lock = self.get_object(request, unquote(object_id))  # None for a pk of another shape too
        if lock is None:
            return self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not getattr(self, f"has_{OPERATIONS[operation].permission}_permission")(request, lock):
            raise PermissionDenied
        response = self.operate(request, [lock], operation, action=False)  # a confirmation page, or None
        if operation == "force_release":
            return response or redirect("admin:locks_synclock_changelist")
        return response or redirect("admin:locks_synclock_change", lock.pk)

    def operate(self, request: HttpRequest, locks: list[SyncLock], operation: str, *, action: bool):
        """Confirm first (a GET, or an action not yet confirmed), else do it for each lock."""
        confirmed = request.POST.get("post") == "yes" if action else request.method == "POST"
        if OPERATIONS[operation].title is not None and not confirmed:
            return self.confirmation(request, locks, operation, action=action)
        by = admin_name(request.user)
        changes = []
        for lock in locks:
            try:
                changes.append(self._one(request, lock, operation, by))
            except (UnknownJob, LockError, RowLocked) as exc:
                self.message_user(request, str(exc), messages.ERROR)
        if operation == "reset_tick":
            self._reset_counts(request, reset=changes.count(True), untouched=changes.count(False))
        return None

    def confirmation(self, request: HttpRequest, locks: list[SyncLock], operation: str, *, action: bool):
        rows = []
        for lock in locks:
            shown = {"token": lock.token, "tick": iso(lock.tick) or "", "done": int(lock.tick_done)}
            cells = {"state": self.state(lock), "lease": self.lease(lock), "tick": self.tick_at(lock)}
            rows.append(
                {"lock": lock, **cells, "fields": [(SHOWN[key] % lock.pk, shown[key]) for key in SHOWN]}
            )
        context = {
            **self.admin_site.each_context(request),
            "title": OPERATIONS[operation].title,
            "operation": operation,
            "opts": self.opts,
            "locks": rows,
            "action": action,
            "note_field": NOTE_FIELD,
            "action_checkbox_name": admin.helpers.ACTION_CHECKBOX_NAME,
            "media": self.media,
        }
        return TemplateResponse(request, "admin/locks/synclock/confirmation.html", context)

    def _one(self, request: HttpRequest, lock: SyncLock, operation: str, by: str) -> bool | None:
        """Do ``operation`` on ``lock`` and say so: whether it changed it, None when a message says why not."""
        job, nothing = lock.job_name, ""  # nothing: what a detail of why nothing changed starts with
        values = {"job": job}
        if operation == "force_release":
            done = force_release(job=job, expected_token=_shown(request, lock)["expected_token"], by=by)
            values.update(holder=done.previous_holder or "—", old=done.previous_token, new=done.token)
            ok = _(
                "Released %(job)s: holder was %(holder)s (token %(old)s); new token %(new)s. "
                "The old holder can no longer renew or release it."
            )
            log = _("Force-released; previous holder %(holder)s (token %(old)s), new token %(new)s.")
            idle, nothing = _("Nothing to release: %(job)s was not held."), gettext("Nothing released: ")
        elif operation == "reset_tick":
            shown = _shown(request, lock)
            if "expected_tick" not in shown:
                message = gettext("Nothing reset for %(job)s: the request did not say which tick was shown.")
                self.message_user(request, message % values, messages.ERROR)
                return None
            done = reset_tick(job=job, by=by, **shown)
            state = gettext("done") if done.was_done else gettext("not done")
            values.update(tick=iso(done.previous_tick), state=state)
            ok, log, idle = "", _("Reset the claimed tick; it was %(tick)s (%(state)s)."), ""
            nothing = gettext("Nothing reset: ")
        elif operation == "pause_jobs":
            done = pause_job(job=job, by=by, note=request.POST.get(NOTE_FIELD, ""))
            values.update(state=done.describe(), note=done.paused_note or gettext("no note"))
            ok = _(
                "Paused %(job)s: no copy runs it (cron, scheduler, run_job, --force, trigger) until it is resumed."
            )
            log, idle = _("Paused: %(note)s"), _("Already paused: %(state)s.")
        elif operation == "resume_jobs":
            done = resume_job(job=job, by=by)
            ok, log = _("Resumed %(job)s: its next slot runs as usual."), _("Resumed.")
            idle = _("Not paused: %(job)s.")
        else:
            done = run_now(job=job, by=by)
            values["pid"] = done.pid
            ok = _(
                "Started a run of %(job)s in the background (pid %(pid)s): it runs under the lease; "
                "its outcome appears in the run history."
            )
            log, idle = _("Run now requested (background process %(pid)s)."), ""
        if done.changed:
            self.log_change(request, lock, str(log) % values)
            if ok:
                self.message_user(request, str(ok) % values, messages.SUCCESS)
        elif done.detail:
            self.message_user(request, f"{nothing}{done.detail}.", messages.WARNING)
        elif idle:
            self.message_user(request, str(idle) % values, messages.WARNING)
        return done.changed if not done.detail else None

    def _reset_counts(self, request: HttpRequest, *, reset: int, untouched: int) -> None:
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


class Styled:
    """The badges and layout of locks/admin.css; an app adds its own badge kinds in its admin's ``Media``."""

    empty_value_display = "—"

    class Media:
        css = {"all": ["locks/admin.css"]}


def column(description: str, show, *, ordering: str | None = None):
    """A list column: ``show(obj)`` under ``description``."""
    return admin.display(description=description, ordering=ordering)(lambda self, obj: show(obj))


def timestamp(field: str, description: str, *, relative: bool = False):
    """A sortable column of ``field`` as ``absolute`` shows it; ``relative``: under how long ago."""

    @admin.display(description=description, ordering=field)
    def show(self, obj) -> str:
        when = getattr(obj, field)
        if relative:
            return "—" if when is None else stacked(ago(when, now=obj.db_now), absolute(when, zone_of(obj)))
        return nowrap(absolute(when, zone_of(obj)))

    return show


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


def ledgers_for(names: list[str]) -> dict[str, Ledger]:
    """The tick ledgers of those of ``names`` that are registered jobs; four queries."""
    try:
        registered = registered_jobs()
    except ImproperlyConfigured:  # the summary line says why
        return {}
    return job_ledgers(jobs=[registered[name] for name in names if name in registered])


class LockChangeList(ChangeList):
    """The locks list, each registered job's tick ledger on its row, read for the whole page at once."""

    def get_results(self, request: HttpRequest) -> None:
        super().get_results(request)
        self.result_list = list(self.result_list)
        ledgers = ledgers_for([lock.job_name for lock in self.result_list])
        for lock in self.result_list:
            lock.ledger = ledgers.get(lock.job_name)


class ReadOnlyAdminMixin:
    """Machine-written rows: nobody adds, edits or deletes them (a new lock row restarts its token at 1)."""

    def has_add_permission(self, request: HttpRequest, obj=None) -> bool:
        return False

    has_change_permission = has_delete_permission = has_add_permission


@admin.register(SyncLock)
class SyncLockAdmin(OperatorAdminMixin, ReadOnlyAdminMixin, Styled, admin.ModelAdmin):
    # Fits 1,400 px (tests/test_browser.py): the key columns first, the last run in one cell.
    list_display = ("job_name", "state", "holder_token", "lease", "tick_at", "last_outcome")
    list_display_links = ("job_name",)
    list_filter = (LockStateFilter, "last_status")
    search_fields = ("job_name", "holder")
    actions = [_action(name) for name in OPERATIONS]
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

    def get_object(self, request: HttpRequest, object_id: str, from_field=None):
        lock = super().get_object(request, object_id, from_field)
        if lock is not None:  # its page shows every time in the job's zone
            lock.shown_zone = timezone_of(lock.job_name)
        return lock

    acquired = timestamp("acquired_at", _("acquired"))
    last_started = timestamp("last_started_at", _("last started"))
    heartbeat = timestamp("heartbeat_at", _("last heartbeat"), relative=True)
    last_finished = timestamp("last_finished_at", _("last finished"), relative=True)

    @admin.display(description=_("tick"), ordering="tick")
    def tick_at(self, lock: SyncLock) -> str:
        if lock.tick is None:
            return "—"
        if lock.tick_done:
            progress = gettext("done")
        elif lock.state in {HELD, OVERDUE}:
            progress = gettext("not done yet")
        else:
            progress = gettext("not done: a later run may retry it")
        return stacked(slot_time(lock.tick, zone_of(lock)), progress)

    @admin.display(description=_("paused"))
    def pause(self, lock: SyncLock) -> str:
        if lock.paused_at is None:
            return gettext("not paused")
        values = {"by": lock.paused_by, "since": absolute(lock.paused_at, zone_of(lock))}
        values["note"] = f": {lock.paused_note}" if lock.paused_note else ""
        return gettext("paused by %(by)s since %(since)s%(note)s") % values

    @admin.display(description=_("state"), ordering="locked_until")
    def state(self, lock: SyncLock) -> str:
        title = ""
        if lock.heartbeat_at is not None and lock.state != FREE:
            title = gettext("last heartbeat %(when)s") % {"when": ago(lock.heartbeat_at, now=lock.db_now)}
        shown = badge(STATE_LABELS[lock.state], lock.state, title)
        return (
            format_html("{}<br>{}", shown, outcome_badge("paused")) if lock.paused_at is not None else shown
        )

    @admin.display(description=_("locked until"), ordering="locked_until")
    def lease(self, lock: SyncLock) -> str:
        if lock.locked_until is None:
            return gettext("released")
        if lock.locked_until < lock.db_now:
            text = gettext("expired %(time)s ago") % {"time": timesince(lock.locked_until, lock.db_now)}
        else:
            text = gettext("in %(time)s") % {"time": timeuntil(lock.locked_until, lock.db_now)}
        return stacked(text, absolute(lock.locked_until, zone_of(lock)))

    last_run = column(_("last run"), lambda lock: status_badge(lock.last_status), ordering="last_status")

    @admin.display(description=_("holder, fencing token"), ordering="holder")
    def holder_token(self, lock: SyncLock) -> str:
        holder = nowrap(lock.holder) if lock.holder else "—"
        return stacked(holder, format_html('{} <span class="token">{}</span>', _("token"), lock.token))

    @admin.display(description=_("last run, ticks"), ordering="last_status")
    def last_outcome(self, lock: SyncLock) -> str:
        """The list's one cell for the last run: outcome, when it finished, how long, the tick strip."""
        finished = lock.last_finished_at and lock.last_status != Outcome.RUNNING
        when = ago(lock.last_finished_at, now=lock.db_now) if finished else ""
        detail = " · ".join(part for part in (when, self.last_duration(lock)) if part not in {"", "—"})
        run = stacked(status_badge(lock.last_status), detail) if detail else status_badge(lock.last_status)
        ledger = getattr(lock, "ledger", None)
        return format_html("{}<br>{}", run, ledger_strip(ledger)) if ledger is not None else run

    @admin.display(description=_("last duration"))
    def last_duration(self, lock: SyncLock) -> str:
        if lock.last_status == Outcome.RUNNING and lock.last_started_at is not None:
            if lock.state == EXPIRED:
                return gettext("did not finish")
            return gettext("running for %(time)s") % {"time": timesince(lock.last_started_at, lock.db_now)}
        return duration(lock.last_started_at, lock.last_finished_at)

    def changelist_view(self, request: HttpRequest, extra_context: dict | None = None) -> HttpResponse:
        summary = lock_summary()
        moments = ("last_success", "next_tick", "paused_at", "paused_incident_since")
        shown = [(job, {name: absolute(getattr(job, name)) for name in moments}) for job in summary.jobs]
        extra_context = {**(extra_context or {}), "lock_summary": summary, "summary_jobs": shown}
        return super().changelist_view(request, extra_context)

    def change_view(
        self, request: HttpRequest, object_id: str, form_url: str = "", extra_context: dict | None = None
    ) -> HttpResponse:
        extra_context = dict(extra_context or {})
        lock = self.get_object(request, unquote(object_id))
        if lock is not None:
            runs = list(JobRun.objects.for_job(lock.job_name).order_by("-started_at")[:RECENT_RUNS])
            ledger = ledgers_for([lock.job_name]).get(lock.job_name)  # None: the job is no longer registered
            upcoming = get_job(lock.job_name).next_slots(count=5) if ledger is not None else []
            zone = lock.shown_zone  # the job's: every time on its page
            extra_context.update(
                ledger=ledger,
                ledger_strip=ledger_strip(ledger) if ledger is not None else "",
                ledger_rows=[
                    {"slot": slot, "badge": outcome_badge(slot.outcome), "at": slot_time(slot.tick, zone)}
                    for slot in (ledger.slots if ledger else [])
                ],
                next_slots=[(slot_time(s.slot, zone), s.dst) for s in upcoming],
                shown_zone=zone,
                paused=lock.paused_at is not None,
                can_pause=self.has_pause_permission(request, lock),
                can_run=self.has_run_permission(request, lock) and ledger is not None,
                control_urls={
                    name: reverse(f"admin:locks_synclock_{name}", args=[lock.pk])
                    for name in ("pause", "resume", "run_now", "force_release")
                },
                recent_runs=[_run_row(run, zone) for run in runs],
                runs_url=f"{reverse('admin:locks_jobrun_changelist')}?{urlencode({'job_name': lock.job_name})}",
                can_force_release=(
                    lock.state in {HELD, OVERDUE} and self.has_force_release_permission(request, lock)
                ),
            )
        return super().change_view(request, object_id, form_url, extra_context)


def _run_row(run: JobRun, zone: str) -> dict:
    return {
        "run": run,
        "started": absolute(run.started_at, zone),
        "tick": absolute(run.tick, zone) if run.tick else gettext("forced"),
        "status": status_badge(run.status),
        "duration": duration(run.started_at, run.finished_at),
        "counts": counts(run.stats),
        "error": excerpt(run.error),
        "url": reverse("admin:locks_jobrun_change", args=[run.pk]),
    }


@admin.register(JobRun)
class JobRunAdmin(ReadOnlyAdminMixin, Styled, admin.ModelAdmin):
    # Its end: on its page (the start and the duration fit 1,400 px).
    list_display = (
        *("job_name", "tick_at", "run_status", "run_holder", "started", "run_duration", "key_counts"),
        *("requested_by", "error_excerpt"),
    )
    list_filter = ("job_name", "status", "requested_by", "started_at")
    date_hierarchy = "started_at"
    search_fields = ("job_name", "holder", "error")
    fields = (
        *("job_name", "tick_at", "run_status", "holder", "token", "started", "finished", "run_duration"),
        *("key_counts", "requested_by", "error", "run_traceback"),
    )
    readonly_fields = fields

    # Written by the lock's bookkeeping; pruned after LOCKS_RUN_RETENTION_DAYS.

    started = timestamp("started_at", _("started"))
    finished = timestamp("finished_at", _("finished"))

    tick_at = column(
        _("tick"), lambda run: nowrap(absolute(run.tick)) if run.tick else gettext("forced"), ordering="tick"
    )
    run_holder = column(_("holder"), lambda run: nowrap(run.holder), ordering="holder")
    run_status = column(_("status"), lambda run: status_badge(run.status), ordering="status")
    run_duration = column(_("duration"), lambda run: duration(run.started_at, run.finished_at))
    key_counts = column(_("counts"), lambda run: counts(run.stats, zeros=False) or "—")

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


@admin.register(Tick)
class TickAdmin(ReadOnlyAdminMixin, Styled, admin.ModelAdmin):
    list_display = (
        "job_name",
        "tick_at",
        "tick_status",
        "holder",
        "claimed_until",
        "claims",
        "first_claimed",
    )
    list_filter = ("job_name", "status")
    date_hierarchy = "tick"
    search_fields = ("job_name", "holder")
    fields = readonly_fields = list_display
    claimed_until = timestamp("until", _("claimed until"))
    first_claimed = timestamp("created_at", _("first claimed"))
    tick_at = timestamp("tick", _("tick"))

    def get_queryset(self, request: HttpRequest):
        held = SyncLock.objects.filter(job_name=OuterRef("job_name"), locked_until__gte=Now())
        return (
            super().get_queryset(request).annotate(db_now=Now(), held_tick=Subquery(held.values("tick")[:1]))
        )

    @admin.display(description=_("status"), ordering="status")
    def tick_status(self, row: Tick) -> str:
        """How its last ask ended: an outcome, or the reason the lease gave for a skip (held, …); a claim
        whose copy never said (killed while its run went on) once it ended and no lease of its tick is held."""
        ended = row.until is not None and row.until < row.db_now and row.held_tick != row.tick
        if row.status == CLAIMED and ended:
            return badge(gettext("claim ended unanswered"), "unanswered")  # its copy stopped meanwhile
        return status_badge(row.status) if row.status in Outcome.values else badge(row.status, row.status)


@admin.register(JobPause)
class JobPauseAdmin(ReadOnlyAdminMixin, Styled, admin.ModelAdmin):
    list_display = ("job_name", "paused", "paused_by", "note", "resumed", "resumed_by")
    list_filter = ("job_name",)
    fields = readonly_fields = list_display
    paused = timestamp("paused_at", _("paused"))
    resumed = timestamp("resumed_at", _("resumed"))
