"""The lock's HTTP endpoints, which a project includes with ``locks.urls``: ``POST /api/jobs/<job>/run``,
``GET /healthz`` and ``GET /metrics`` (docs/deployment.md, "Serving the admin and the endpoints")."""

from __future__ import annotations

import contextlib
import functools
import hashlib
import hmac
import ipaddress
import logging
import math
from collections import namedtuple
from collections.abc import Iterable
from datetime import UTC, datetime, timedelta
from itertools import islice
from typing import TYPE_CHECKING

from django.conf import settings
from django.db import Error as DBError  # DatabaseError and InterfaceError
from django.db import IntegrityError, router, transaction
from django.db.models import Count
from django.db.models.functions import Now
from django.http import Http404, HttpRequest, HttpResponse, HttpResponsePermanentRedirect, JsonResponse
from django.utils import timezone
from django.utils.log import log_response
from django.utils.module_loading import import_string
from django.views.decorators.cache import never_cache
from django.views.decorators.csrf import csrf_exempt
from django.views.decorators.http import require_POST, require_safe

from locks.db import STANDBY, error_text, standby
from locks.lease import LockError, iso
from locks.models import HELD, OVERDUE, RECORDED, JobRun, Outcome, Throttle, database_now, now_plus
from locks.registry import SLOT_ERRORS, UnknownJob, get_job
from locks.registry import jobs as registered_jobs
from locks.runner import RunResult, run_due, run_job
from locks.status import OUTCOMES, Freshness, job_ledgers, jobs_freshness, jobs_health, open_incidents

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry
    from prometheus_client.core import Metric

    from locks.status import OpenIncident


# The words for yes and no of a trigger's ?force= (case and spaces aside), config/env.py's too.
TRUE_WORDS = ("1", "true", "yes", "on")
FALSE_WORDS = ("0", "false", "no", "off")


def bearer_token_matches(request: HttpRequest, expected: str) -> bool:
    """``Authorization: Bearer <expected>``, in constant time; an empty ``expected`` never matches."""
    scheme, _, given = request.headers.get("Authorization", "").partition(" ")
    given = given.strip() if scheme.lower() == "bearer" else ""
    digests = (hashlib.sha256(value.encode()).digest() for value in (given, expected))
    return hmac.compare_digest(*digests) and bool(expected)


MAX_ADDRESS_LENGTH = 64  # the longest IPv6 address is 45 characters, a zone id adds a few


def client_address(request: HttpRequest) -> str:
    """The TCP peer, or the N-th X-Forwarded-For entry from the right (N: ``LOCKS_TRUSTED_PROXY_COUNT``)
    if it is an address, in its canonical form (docs/security.md, "What is protected, and by what")."""
    hops = [hop.strip() for hop in request.META.get("HTTP_X_FORWARDED_FOR", "").split(",") if hop.strip()]
    proxies = settings.LOCKS_TRUSTED_PROXY_COUNT
    candidate = canonical_address(hops[-min(proxies, len(hops))]) if proxies > 0 and hops else None
    return candidate or request.META.get("REMOTE_ADDR", "")


def canonical_address(value: str) -> str | None:
    """``value`` as an address in its canonical form (no IPv6 zone id, IPv4-mapped as IPv4), or None."""
    if len(value) > MAX_ADDRESS_LENGTH:
        return None
    try:
        address = ipaddress.ip_address(value)
    except ValueError:
        return None
    if isinstance(address, ipaddress.IPv6Address):
        address = address.ipv4_mapped or ipaddress.IPv6Address(address.packed)  # packed has no zone
    return str(address)


def operational(view):
    """A view whose own 5xx answers are logged as WARNING, not mailed (docs/deployment.md, "GET /healthz")."""

    @functools.wraps(view)
    def answer(request: HttpRequest, *args, **kwargs) -> HttpResponse:
        response = view(request, *args, **kwargs)
        if response.status_code >= 500:  # marks it logged: Django's handler does not log it again
            args = (response.reason_phrase, request.path)
            log_response("%s: %s", *args, response=response, request=request, level="warning")
        return response

    return answer


def enabled_by(setting: str, what: str):
    """A view disabled (404, whatever the method) while ``setting`` is empty."""

    def decorate(view):
        @functools.wraps(view)
        def enabled(request: HttpRequest, *args, **kwargs) -> HttpResponse:
            if not getattr(settings, setting):
                raise Http404(f"{what} is disabled: {setting} is not set.")
            return view(request, *args, **kwargs)

        return enabled

    return decorate


# A throttle's answer; retry_after: whole seconds until the key can be claimed again.
Claim = namedtuple("Claim", "allowed retry_after", defaults=(0,))
THROTTLE_OPEN = datetime(1970, 1, 1, tzinfo=UTC)  # a new key's row: claimable at once


def throttle_claim(*, key: str, window: timedelta) -> Claim:
    """Claim ``key`` for ``window`` if nobody claimed it within the last ``window``."""
    claimable = Throttle.objects.filter(key=key, until__lte=Now())
    if claimable.update(until=now_plus(window)):
        return Claim(allowed=True)
    try:  # a new key's row, open (a plain value: MongoDB cannot insert an expression), then claimed
        with transaction.atomic(using=router.db_for_write(Throttle)):
            Throttle.objects.create(key=key, until=THROTTLE_OPEN)
    except IntegrityError:
        pass  # the key exists: its window is open or closed, as the conditional update finds
    if claimable.update(until=now_plus(window)):
        return Claim(allowed=True)
    row = Throttle.objects.filter(key=key).annotate(db_now=Now()).values_list("until", "db_now").first()
    remaining = (row[0] - row[1]).total_seconds() if row else 0.0
    return Claim(allowed=False, retry_after=max(1, math.ceil(remaining)))


logger = logging.getLogger(__name__)
# The most runs one trigger request makes to catch slots up (catch_up "all"); the answer's
# ``behind`` says whether slots are still behind after them.
TRIGGER_MOST_RUNS = 100


@operational
@csrf_exempt  # a machine endpoint authenticated by its bearer token, not by a session cookie
@never_cache
@enabled_by("LOCKS_TRIGGER_TOKEN", "The job trigger")
@require_POST
def trigger_job(request: HttpRequest, job: str) -> JsonResponse:
    """Run the registered ``job`` under its lease for the tick of now (or ``?force=1``), as run_job does."""
    if not bearer_token_matches(request, settings.LOCKS_TRIGGER_TOKEN):
        # The same answer for a missing and a wrong token: no hint either way.
        challenge = {"WWW-Authenticate": 'Bearer realm="job trigger"'}
        return JsonResponse({"error": "authentication required"}, status=401, headers=challenge)
    # After the token: only a caller that may run jobs learns which ones exist.
    try:
        get_job(job)
    except UnknownJob as exc:
        return JsonResponse({"error": exc.args[0]}, status=404)
    flag = request.GET.get("force", "").strip().lower()
    if flag not in {"", *TRUE_WORDS, *FALSE_WORDS}:
        error = f"force={request.GET['force']!r} is not a flag; use force=1 or leave it out"
        return JsonResponse({"error": error}, status=400)
    force = flag in TRUE_WORDS

    address = client_address(request)
    window = timedelta(seconds=settings.LOCKS_TRIGGER_RATE_WINDOW)
    try:
        claim = throttle_claim(key=f"{job}:{address}", window=window)
    except DBError as exc:
        reason = f"database unreachable: {error_text(exc)}"
        logger.warning("job=%s trigger from %s skipped: %s", job, address, reason)
        return JsonResponse({"job": job, "outcome": "skipped", "reason": reason}, status=503)
    if not claim.allowed:
        error = (
            f"rate limited: one request per {window.total_seconds():g} s per client; "
            f"retry in {claim.retry_after} s"
        )
        return JsonResponse({"error": error}, status=429, headers={"Retry-After": str(claim.retry_after)})

    logger.info("job=%s triggered over HTTP by %s%s", job, address, " (forced)" if force else "")
    try:
        if force:
            results = [run_job(name=job, force=True, requested_by="trigger")]
        else:  # what `run_job NAME` runs: under catch_up "all", each slot still behind, oldest first
            results = list(islice(run_due(name=job, requested_by="trigger"), TRIGGER_MOST_RUNS))
    except LockError as exc:  # the lock table is missing: a deployment without `migrate`
        return JsonResponse({"job": job, "outcome": "failed", "error": str(exc)}, status=503)
    # The last run is the answer (the one that stopped the catch-up); each run's outcome under "runs".
    last = results[-1]
    payload = {**_run_payload(last), "runs": [_run_payload(result) for result in results]}
    payload["behind"] = last.next_due_now  # more slots behind than one request runs: trigger again
    return JsonResponse(payload, status=last.outcome.answer.http_status)


def _run_payload(result: RunResult) -> dict:
    payload = {
        "job": result.job,
        "outcome": result.outcome.reported,
        "tick": iso(result.tick),
        "forced": result.claimed == "forced",
        "holder": result.holder,
        "token": result.token,
        "timeline": result.grant.timeline,  # with the token, the pair that names a lease (rule 16)
        "counts": result.stats,
        "duration": round(result.duration, 3),
    }
    if result.reason:
        payload["reason"] = result.reason
    if result.skip is not None:
        if result.skip.reason == "paused":  # stronger than force: who paused it, since when and why
            payload.update(
                reason="paused",
                detail=result.reason,
                paused_by=result.skip.pause.by,
                paused_at=iso(result.skip.pause.since),
                paused_note=result.skip.pause.note,
            )
        payload["skip"] = {
            "kind": result.skip.reason,
            "holder": result.skip.holder,
            "locked_until": iso(result.skip.locked_until),
            "claimed_tick": iso(result.skip.claimed_tick),
        }
    if result.failure.error:
        payload["error"] = result.failure.error
    return payload


@operational
@require_safe
@never_cache
def healthz(request: HttpRequest) -> HttpResponse:
    """200 while every job of ``LOCKS_JOBS`` is fresh (or paused, unless
    ``LOCKS_HEALTHZ_PAUSED_UNHEALTHY``), else 503; each job under ``jobs`` (docs/deployment.md)."""
    if settings.SECURE_SSL_REDIRECT and not request.is_secure() and "Authorization" in request.headers:
        # /healthz is exempt from the HTTPS redirect for plain probes (SECURE_REDIRECT_EXEMPT),
        # not for a request that sends credentials: it is redirected like every other.
        host = settings.SECURE_SSL_HOST or request.get_host()
        return HttpResponsePermanentRedirect(f"https://{host}{request.get_full_path()}")
    trusted = bearer_token_matches(request, settings.LOCKS_HEALTHZ_TOKEN)
    summary = settings.LOCKS_HEALTHZ_JOB
    try:
        freshness = jobs_freshness()
        # The open incidents (locks.contrib.alerts, if installed): a detail, only for a monitor that may see them.
        incidents = open_incidents() if trusted else {}
    except DBError as exc:
        status = STANDBY if standby(exc) else "database unreachable"
        body = {"status": status, "database": False, **({"job": summary} if summary else {})}
        if trusted:
            body["error"] = error_text(exc)
        return JsonResponse(body, status=503)

    healthy = {"ok"} if settings.LOCKS_HEALTHZ_PAUSED_UNHEALTHY else {"ok", "paused"}
    fresh = all(job.status in healthy for job in freshness.values())
    body = {"status": "ok" if fresh else "stale", "database": True}
    jobs = {name: _job_health(job, trusted=trusted) for name, job in freshness.items()}
    if summary in jobs:  # the fields /healthz had before it reported every job, but its status: every job's
        body.update(job=summary, **{key: value for key, value in jobs[summary].items() if key != "status"})
    body["jobs"] = jobs
    if trusted:
        for name, fields in jobs.items():
            fields["incident"] = _incident(incident) if (incident := incidents.get(name)) else None
    return JsonResponse(body, status=200 if fresh else 503)


def _incident(incident: OpenIncident) -> dict:
    fields = {"reason": incident.reason, "summary": incident.summary, "opened_at": iso(incident.opened_at)}
    return {**fields, "email": incident.email, "email_sent": incident.email == "sent"}


# What an anonymous /healthz request does not see of a lock: names of hosts and operators, free text.
DETAILS = ("holder", "last_error", "paused_by", "paused_note")


def _job_health(health: Freshness, *, trusted: bool) -> dict:
    job, lock = health.job, health.job.lock
    age = job.db_now - job.last_success_at if job.last_success_at and job.db_now else None
    body = {
        "status": health.status,  # ok, stale, paused (not judged stale) or error (no slot computable)
        "schedule": health.cron.expression,
        "stale_after": iso(health.stale_after),
        "last_success_at": iso(job.last_success_at),
        "last_success_age_seconds": round(age.total_seconds(), 3) if age is not None else None,
        "lock": None,
    }
    if health.error:
        body["error"] = health.error
    if lock is not None:
        hidden = {"job", "db_now"} if trusted else {"job", "db_now", *DETAILS}
        body["lock"] = {key: value for key, value in lock.as_json().items() if key not in hidden}
    return body


@operational
@never_cache
@enabled_by("LOCKS_METRICS_TOKEN", "/metrics")
@require_safe
def metrics_view(request: HttpRequest) -> HttpResponse:
    if not bearer_token_matches(request, settings.LOCKS_METRICS_TOKEN):
        response = HttpResponse("authentication required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest  # the extra [prometheus]: locks.E034

    try:
        body = generate_latest(scrape_registry())
    except DBError as exc:
        return HttpResponse(
            f"database unreachable: {error_text(exc)}\n", status=503, content_type="text/plain"
        )
    return HttpResponse(body, content_type=CONTENT_TYPE_LATEST)


class _Families:
    """A collector over metric families already computed (prometheus_client's custom collectors)."""

    def __init__(self, families: Iterable[Metric]) -> None:
        self.families = list(families)

    def collect(self) -> Iterable[Metric]:
        return self.families


def scrape_registry() -> CollectorRegistry:
    """A registry holding this scrape's metrics (``DatabaseError`` when the database cannot be read)."""
    from prometheus_client import CollectorRegistry

    registry = CollectorRegistry(auto_describe=True)
    registry.register(_Families(job_metrics()))
    for path in settings.LOCKS_METRICS_COLLECTORS:
        registry.register(_Families(import_string(path)()))
    return registry


# The locks_* families, in the order a scrape shows them: name, documentation, labels.
GAUGES = (
    ("locks_job_last_success_timestamp_seconds", "When the job's last successful run ended.", ["job"]),
    ("locks_job_next_tick_timestamp_seconds", "The job's next slot (UTC).", ["job"]),
    ("locks_job_paused", "1 while an operator has paused the job.", ["job"]),
    ("locks_job_incident_open", "1 while check_jobs has an incident open for the job.", ["job"]),
    (
        "locks_job_runs",
        "Runs of the job in the run history (LOCKS_RUN_RETENTION_DAYS), by status.",
        ["job", "status"],
    ),
    ("locks_job_last_duration_seconds", "How long the job's last finished run took.", ["job"]),
    ("locks_lease_held", "1 while a holder's lease on the job is in force.", ["job"]),
    (
        "locks_ticks",
        "The job's slots in the tick ledger (LOCKS_LEDGER_SLOTS), by outcome.",
        ["job", "outcome"],
    ),
    ("locks_clock_skew_seconds", "This host's clock minus the database's.", []),
)


def job_metrics() -> list[Metric]:
    """The locks_* families, for every registered job."""
    from prometheus_client.core import GaugeMetricFamily

    registered = registered_jobs()
    health = jobs_health(jobs=registered)
    ledgers = job_ledgers(jobs=registered.values())
    incidents = open_incidents(jobs=registered)
    runs = JobRun.objects.filter(job_name__in=registered).order_by().values("job_name", "status")
    families = [GaugeMetricFamily(name, text, labels=labels) for name, text, labels in GAUGES]
    last_success, next_slot, paused, incident, run_counts, duration, held, ticks, skew = families
    db_now = database_now()
    for name, job in registered.items():
        lock = health[name].lock
        if health[name].last_success_at is not None:
            last_success.add_metric([name], health[name].last_success_at.timestamp())
        with contextlib.suppress(*SLOT_ERRORS):  # no slot computable: that job has no next tick
            next_slot.add_metric([name], job.cron.next_slot(db_now).timestamp())
        paused.add_metric([name], float(ledgers[name].paused))
        incident.add_metric([name], float(name in incidents))
        held.add_metric([name], float(lock is not None and lock.state in {HELD, OVERDUE}))
        if lock and (run := lock.last_run).finished_at and run.started_at and run.status != Outcome.RUNNING:
            duration.add_metric([name], (run.finished_at - run.started_at).total_seconds())
        for outcome in OUTCOMES:
            ticks.add_metric([name, outcome], ledgers[name].counts.get(outcome, 0))
    seen = {(row["job_name"], row["status"]): row["count"] for row in runs.annotate(count=Count("pk"))}
    for name in registered:
        for status, _label in RECORDED:
            run_counts.add_metric([name, status], seen.get((name, status), 0))
    skew.add_metric([], (timezone.now() - db_now).total_seconds())
    return families
