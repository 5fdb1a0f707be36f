"""The admin's controls of a job, for ``SyncLockAdmin``: pause and resume (``locks.pausing``,
permission ``locks.pause_synclock``) and run now (``locks.run_now``, permission
``locks.run_synclock``), as list actions and as buttons on a lock's page. Each one that changes
something leaves a ``LogEntry``; the services log their WARNING lines.
"""

from __future__ import annotations

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseNotAllowed, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.translation import gettext
from django.utils.translation import gettext_lazy as _

from locks.claims import iso
from locks.models import SyncLock
from locks.pausing import pause_job, resume_job
from locks.registry import UnknownJob, get_job
from locks.run_now import start_run_now

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
