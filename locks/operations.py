"""The operator's two writes on a job lock, force release and reset of the claimed tick,
and the admin's actions that call them (``manage.py locks release`` calls them too).

Like every lease change they are compare-and-sets on the row, judged by the database
clock. In the admin they need ``locks.force_release_synclock``, ask for confirmation
first and leave a ``LogEntry``; the confirmation page carries the fencing token it
showed, so a release only ever releases that holder (docs/architecture.md, "The rules": 9).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from datetime import datetime

from django.contrib import admin, messages
from django.contrib.admin.utils import unquote
from django.core.exceptions import PermissionDenied
from django.db.models import F
from django.db.models.functions import Now
from django.http import HttpRequest, HttpResponse, HttpResponseRedirect
from django.template.response import TemplateResponse
from django.urls import path, reverse
from django.utils.translation import gettext, ngettext
from django.utils.translation import gettext_lazy as _

from locks.leases import LockError, iso
from locks.models import EXPIRED, FREE, HELD, OVERDUE, JobRun, RunStatus, SyncLock
from locks.registry import UnknownJob

# The name the lock's log lines have always carried (operators filter on it).
logger = logging.getLogger("locks.api")


@dataclass(frozen=True)
class ForcedRelease:
    """What ``force_release`` did. ``was_held``: this call released the lease;
    otherwise ``detail`` says why not (empty when the lease was simply free)."""

    job: str
    previous_holder: str
    previous_token: int
    was_held: bool
    token: int
    detail: str = ""


@dataclass(frozen=True)
class TickReset:
    job: str
    previous_tick: datetime | None
    was_done: bool

    @property
    def was_set(self) -> bool:
        return self.previous_tick is not None


def force_release(*, job: str, expected_token: int | None = None, by: str = "") -> ForcedRelease:
    """Clear the lease on ``job`` while it is held (by the database clock) and
    bump the fencing token, so the old holder can neither renew nor release it.

    With ``expected_token``, only the lease with that token: the holder an
    operator was shown, not one that took over since. When nothing is
    released, the result's ``detail`` says why; nothing is changed.
    """
    by = by or "unknown"
    rows = SyncLock.objects.for_job(job)
    for _attempt in range(5):
        row = rows.with_state().values("holder", "token", "state", "last_status", "locked_until").first()
        if row is None:
            raise _no_lock(job)
        holder, token = row["holder"], row["token"]
        if expected_token is not None and token != expected_token:
            now = f" held by {holder}" if row["state"] in {HELD, OVERDUE} else f", not held {_not_held(row)}"
            detail = f"lease on {job} is now token {token}{now}; nothing released"
            return ForcedRelease(job, holder, token, False, token, detail)
        if row["state"] not in {HELD, OVERDUE}:
            detail = (
                ""
                if expected_token is None and row["state"] == FREE
                else (
                    f"lease on {job} (token {token}) is not held any more {_not_held(row)}; nothing released"
                )
            )
            return ForcedRelease(job, holder, token, False, token, detail)
        # Compare-and-set on the token we read, while still held: a new holder in
        # between, or a holder that finished meanwhile, is not released.
        if (
            rows.filter(token=token)
            .held()
            .update(
                holder="",
                locked_until=None,
                token=F("token") + 1,
                last_finished_at=Now(),
                last_status=RunStatus.RELEASED,
                last_error=f"force-released by {by}; holder was {holder}",
            )
        ):
            # The released holder's run can no longer finish under its lease; if the
            # holder is alive its own bookkeeping may still overwrite this.
            JobRun.objects.for_job(job).filter(token=token, status=RunStatus.RUNNING).update(
                status=RunStatus.LOST_LOCK, finished_at=Now(), error=f"force-released by {by}"
            )
            logger.warning(
                "job=%s force-released by %s; previous holder %s (token %s), new token %s",
                job,
                by,
                holder,
                token,
                token + 1,
            )
            return ForcedRelease(job, holder, token, True, token + 1)
    raise LockError(f"lock {job!r} kept changing while it was being released; try again")


def _no_lock(job: str) -> UnknownJob:
    """The jobs it names are those with a lock row: a registered job has one from its first run."""
    known = ", ".join(SyncLock.objects.values_list("job_name", flat=True)) or "none yet"
    return UnknownJob(f"no lock named {job!r} (known jobs: {known})")


def _not_held(row: dict) -> str:
    if row["state"] == EXPIRED:
        return (
            f"(its lease expired at {iso(row['locked_until'])} without being released; "
            "the next run takes it over)"
        )
    return f"(finished as {row['last_status'] or 'nothing yet'})"


def reset_tick(*, job: str, by: str = "") -> TickReset:
    """Forget the tick ``job`` claimed last, so the next scheduled run may claim
    any tick again (for example after a far-future ``--tick`` was stored). Works
    whether or not the lease is held; it does not release it."""
    by = by or "unknown"
    rows = SyncLock.objects.for_job(job)
    for _attempt in range(5):
        row = rows.values("token", "tick", "tick_done").first()
        if row is None:
            raise _no_lock(job)
        if row["tick"] is None:
            return TickReset(job, None, False)
        # Compare-and-set on what we read: a run that claimed a tick in between is
        # not undone without the operator seeing it.
        if rows.filter(**row).update(tick=None, tick_done=False):
            logger.warning(
                "job=%s claimed tick reset by %s; it was %s (%s)",
                job,
                by,
                iso(row["tick"]),
                "done" if row["tick_done"] else "not done",
            )
            return TickReset(job, row["tick"], row["tick_done"])
    raise LockError(f"lock {job!r} kept changing while its tick was being reset; try again")


# --- the admin's actions (SyncLockAdmin) ------------------------------------------------

SHOWN_INPUT = "shown-%s"  # the fencing token shown, one hidden input per lock


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
            except (UnknownJob, LockError) as exc:
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
            try:
                result = reset_tick(job=lock.job_name, by=by)
            except (UnknownJob, LockError) as exc:
                self.message_user(request, str(exc), messages.ERROR)
                continue
            if not result.was_set:
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


def _shown_token(request: HttpRequest, lock: SyncLock) -> int | None:
    """The fencing token the confirmation page showed for ``lock``, if it sent one."""
    value = request.POST.get(SHOWN_INPUT % lock.pk)
    try:
        return int(value) if value is not None else None
    except ValueError:
        return -1  # matches no lease: nothing is released, and the message says what is there now
