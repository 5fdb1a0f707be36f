"""``POST /api/jobs/<job>/run`` for external schedulers, and ``GET /healthz`` (``locks.urls``)."""

from __future__ import annotations

import logging
from datetime import timedelta

from django.conf import settings
from django.db import Error as DBError  # DatabaseError and InterfaceError
from django.http import Http404, HttpRequest, HttpResponse, HttpResponsePermanentRedirect, JsonResponse
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST, require_safe

from locks.auth import bearer_token_matches, boolean, client_address
from locks.claims import iso
from locks.leases import LockError
from locks.models import Incident
from locks.registry import Job, UnknownJob, get_job
from locks.results import RunResult
from locks.runner import run_job
from locks.selectors import Freshness, jobs_freshness
from locks.text import error_text
from locks.throttle import throttle_claim

logger = logging.getLogger(__name__)


@csrf_exempt  # a machine endpoint authenticated by its bearer token, not by a session cookie
@never_cache
def trigger_job(request: HttpRequest, job: str) -> JsonResponse:
    """Run the registered ``job`` under its lease for the tick of now (or ``?force=1``),
    as ``run_job`` does. Disabled (404, whatever the method) without LOCKS_TRIGGER_TOKEN."""
    if not settings.LOCKS_TRIGGER_TOKEN:
        raise Http404("The job trigger is disabled: LOCKS_TRIGGER_TOKEN is not set.")
    return _trigger(request, job)


@require_POST
def _trigger(request: HttpRequest, job: str) -> JsonResponse:
    if not bearer_token_matches(request, settings.LOCKS_TRIGGER_TOKEN):
        # The same answer for a missing and a wrong token: no hint either way.
        response = JsonResponse({"error": "authentication required"}, status=401)
        response["WWW-Authenticate"] = 'Bearer realm="job trigger"'
        return response
    # After the token: only a caller that may run jobs learns which ones exist.
    try:
        registered = get_job(job)
    except UnknownJob as exc:
        return JsonResponse({"error": exc.args[0]}, status=404)
    given = request.GET.get("force", "").strip()
    force = boolean(given) if given else False
    if force is None:
        return JsonResponse(
            {"error": f"force={request.GET['force']!r} is not a flag; use force=1 or leave it out"},
            status=400,
        )

    address = client_address(request)
    window = timedelta(seconds=settings.LOCKS_TRIGGER_RATE_WINDOW)
    try:
        claim = throttle_claim(key=f"{job}:{address}", window=window)
    except DBError as exc:
        reason = f"database unreachable: {error_text(exc)}"
        logger.warning("job=%s trigger from %s skipped: %s", job, address, reason)
        return JsonResponse({"job": job, "outcome": "skipped", "reason": reason}, status=503)
    if not claim.allowed:
        response = JsonResponse(
            {
                "error": (
                    f"rate limited: one request per {window.total_seconds():g} s per client; "
                    f"retry in {claim.retry_after} s"
                )
            },
            status=429,
        )
        response["Retry-After"] = str(claim.retry_after)
        return response

    logger.info("job=%s triggered over HTTP by %s%s", job, address, " (forced)" if force else "")
    try:
        result = run_job(name=job, force=force, requested_by="trigger")
    except LockError as exc:  # the lock table is missing: a deployment without `migrate`
        return JsonResponse({"job": job, "outcome": "failed", "error": str(exc)}, status=503)
    return JsonResponse(_run_payload(result), status=_run_status(result, registered))


def _run_status(result: RunResult, job: Job) -> int:
    if result.outcome == "succeeded":
        return 200
    if result.outcome == "skipped":
        return 409 if result.skip is not None else 503  # no Skip: the database was unreachable
    if isinstance(result.exception, job.error_classes()):
        return 502  # an outside system failed the way the job expects (its expected_errors)
    if isinstance(result.exception, DBError):
        return 503
    return 500  # the lease was lost mid-run, or a bug (logged with its traceback)


def _run_payload(result: RunResult) -> dict:
    payload = {
        "job": result.job,
        # lost_lock is a failure to the caller; the JobRun row keeps the detail.
        "outcome": "failed" if result.outcome == "lost_lock" else result.outcome,
        "tick": iso(result.tick),
        "forced": result.tick is None,
        "holder": result.holder,
        "token": result.token,
        "counts": result.stats,
        "duration": round(result.duration, 3),
    }
    if result.reason:
        payload["reason"] = result.reason
    if result.skip is not None and result.skip.reason == "paused":
        # A pause is stronger than force: who paused it, since when and why, for the caller to act on.
        payload.update(
            reason="paused",
            detail=result.reason,
            paused_by=result.skip.paused_by,
            paused_at=iso(result.skip.paused_at),
            paused_note=result.skip.paused_note,
        )
    if result.skip is not None:
        payload["skip"] = {
            "kind": result.skip.reason,
            "holder": result.skip.holder,
            "locked_until": iso(result.skip.locked_until),
            "claimed_tick": iso(result.skip.claimed_tick),
        }
    if result.error:
        payload["error"] = result.error
    return payload


@require_safe
@never_cache
def healthz(request: HttpRequest) -> HttpResponse:
    """200 while every job of ``LOCKS_JOBS`` succeeded within two slots of its schedule,
    else 503. ``jobs`` reports each one; the top-level fields repeat those of
    ``LOCKS_HEALTHZ_JOB``, if set (the answer's shape before it reported every job).

    Holder host names and error texts only for a request that carries ``LOCKS_HEALTHZ_TOKEN``.
    """
    if settings.SECURE_SSL_REDIRECT and not request.is_secure() and "Authorization" in request.headers:
        # /healthz is exempt from the HTTPS redirect for plain probes (SECURE_REDIRECT_EXEMPT),
        # not for a request that sends credentials: it is redirected like every other.
        host = settings.SECURE_SSL_HOST or request.get_host()
        return HttpResponsePermanentRedirect(f"https://{host}{request.get_full_path()}")
    trusted = bearer_token_matches(request, settings.LOCKS_HEALTHZ_TOKEN)
    summary = settings.LOCKS_HEALTHZ_JOB
    try:
        freshness = jobs_freshness()
        # check_jobs' open incidents (locks.alerts): a detail, only for a monitor that may see them.
        incidents = {incident.job_name: incident for incident in Incident.objects.open()} if trusted else {}
    except DBError as exc:
        body = {"status": "database unreachable", "database": False, **({"job": summary} if summary else {})}
        if trusted:
            body["error"] = error_text(exc)
        return JsonResponse(body, status=503)

    fresh = all(job.fresh for job in freshness.values())
    body = {"status": "ok" if fresh else "stale", "database": True}
    if summary in freshness:  # the fields /healthz had before it reported every job
        fields = _job_health(freshness[summary], trusted=trusted)
        del fields["status"]  # the top-level status is every job's
        body.update(job=summary, **fields)
    body["jobs"] = {name: _job_health(job, trusted=trusted) for name, job in freshness.items()}
    if trusted:
        for name, fields in body["jobs"].items():
            fields["incident"] = _incident(incidents.get(name))
    return JsonResponse(body, status=200 if fresh else 503)


def _incident(incident: Incident | None) -> dict | None:
    if incident is None:
        return None
    return {
        "reason": incident.reason,
        "summary": incident.summary,
        "opened_at": iso(incident.opened_at),
        "email_sent": incident.opened_mail_at is not None,
    }


def _job_health(health: Freshness, *, trusted: bool) -> dict:
    job, lock = health.job, health.job.lock
    age = job.last_success_age
    body = {
        "status": "ok" if health.fresh else "stale",
        "schedule": health.schedule,
        "stale_after": iso(health.stale_after),
        "last_success_at": iso(job.last_success_at),
        "last_success_age_seconds": round(age.total_seconds(), 3) if age is not None else None,
        "lock": None,
    }
    if lock is not None:
        # Holder host names and error texts only for a request that carries LOCKS_HEALTHZ_TOKEN.
        hidden = {"job", "db_now"} if trusted else {"job", "db_now", "holder", "last_error"}
        body["lock"] = {key: value for key, value in lock.as_json().items() if key not in hidden}
    return body
