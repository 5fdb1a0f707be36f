"""The admin's actions on job locks, force release and reset of the claimed tick, for
``SyncLockAdmin``: each needs ``locks.force_release_synclock``, asks for confirmation first and
leaves a ``LogEntry``. The confirmation page carries what it showed (the fencing token; for a
reset the claimed tick and whether it was done), so an action only ever acts on that
(docs/architecture.md, "The rules": 9). The writes themselves are ``locks.operations``'.
"""

from __future__ import annotations

from datetime import datetime

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from locks.bounds import RowLocked
from locks.claims import iso
from locks.leases import LockError
from locks.models import SyncLock
from locks.operations import force_release, reset_tick
from locks.registry import UnknownJob

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
