"""``GET /metrics``: the jobs in the Prometheus text format, computed from the database at scrape
time (a registry of its own per scrape, no process state), so every replica answers the same
cluster-wide truth. A bounded number of queries whatever the number of runs; more metric
families come from ``LOCKS_METRICS_COLLECTORS`` (another app's, e.g. its reminders).
Behind ``Authorization: Bearer $LOCKS_METRICS_TOKEN``; 404 when it is unset.
"""

from __future__ import annotations

from collections.abc import Iterable

from django.conf import settings
from django.db import Error as DBError
from django.db.models import Count
from django.http import Http404, HttpRequest, HttpResponse
from django.utils import timezone
from django.utils.module_loading import import_string
from django.views.decorators.cache import never_cache
from django.views.decorators.http import require_safe
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.core import GaugeMetricFamily, Metric
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from locks.auth import bearer_token_matches
from locks.ledger import OUTCOMES, job_ledgers
from locks.models import HELD, OVERDUE, Incident, JobRun, RunStatus, database_now
from locks.registry import jobs as registered_jobs
from locks.schedule import next_tick
from locks.selectors import jobs_health
from locks.text import error_text


@never_cache
def metrics_view(request: HttpRequest) -> HttpResponse:
    """Disabled (404, whatever the method) without LOCKS_METRICS_TOKEN, like the trigger."""
    if not settings.LOCKS_METRICS_TOKEN:
        raise Http404("/metrics is disabled: LOCKS_METRICS_TOKEN is not set.")
    return _metrics(request)


@require_safe
def _metrics(request: HttpRequest) -> HttpResponse:
    if not bearer_token_matches(request, settings.LOCKS_METRICS_TOKEN):
        response = HttpResponse("authentication required\n", status=401, content_type="text/plain")
        response["WWW-Authenticate"] = 'Bearer realm="metrics"'
        return response
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
    """A registry holding this scrape's metrics; raises ``DatabaseError`` when the database
    cannot be read."""
    registry = CollectorRegistry(auto_describe=True)
    registry.register(_Families(job_metrics()))
    for path in settings.LOCKS_METRICS_COLLECTORS:
        registry.register(_Families(import_string(path)()))
    return registry


def _gauge(name: str, documentation: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, documentation, labels=labels)


def job_metrics() -> list[Metric]:
    """The locks_* families, for every registered job."""
    registered = registered_jobs()
    health = jobs_health(jobs=registered)
    ledgers = job_ledgers(jobs=registered.values())
    open_incidents = set(
        Incident.objects.open().filter(job_name__in=registered).values_list("job_name", flat=True)
    )
    runs = (
        JobRun.objects.filter(job_name__in=registered)
        .order_by()
        .values("job_name", "status")
        .annotate(count=Count("pk"))
        .values_list("job_name", "status", "count")
    )
    last_success = _gauge(
        "locks_job_last_success_timestamp_seconds", "When the job's last successful run ended.", ["job"]
    )
    next_slot = _gauge("locks_job_next_tick_timestamp_seconds", "The job's next slot (UTC).", ["job"])
    paused = _gauge("locks_job_paused", "1 while an operator has paused the job.", ["job"])
    incident = _gauge(
        "locks_job_incident_open", "1 while check_jobs has an incident open for the job.", ["job"]
    )
    run_counts = _gauge(
        "locks_job_runs",
        "Runs of the job in the run history (LOCKS_RUN_RETENTION_DAYS), by status.",
        ["job", "status"],
    )
    duration = _gauge(
        "locks_job_last_duration_seconds", "How long the job's last finished run took.", ["job"]
    )
    held = _gauge("locks_lease_held", "1 while a holder's lease on the job is in force.", ["job"])
    ticks = _gauge(
        "locks_ticks",
        "The job's slots in the tick ledger (LOCKS_LEDGER_SLOTS), by outcome.",
        ["job", "outcome"],
    )
    db_now = database_now()
    for name, job in registered.items():
        lock = health[name].lock
        if health[name].last_success_at is not None:
            last_success.add_metric([name], health[name].last_success_at.timestamp())
        next_slot.add_metric([name], next_tick(job.schedule, now=db_now).timestamp())
        paused.add_metric([name], float(ledgers[name].paused))
        incident.add_metric([name], float(name in open_incidents))
        held.add_metric([name], float(lock is not None and lock.state in {HELD, OVERDUE}))
        if (
            lock is not None
            and lock.last_finished_at
            and lock.last_started_at
            and lock.last_status != RunStatus.RUNNING
        ):
            duration.add_metric([name], (lock.last_finished_at - lock.last_started_at).total_seconds())
        for outcome in OUTCOMES:
            ticks.add_metric([name, outcome], ledgers[name].counts.get(outcome, 0))
    seen = {(name, status): count for name, status, count in runs}
    for name in registered:
        for status in RunStatus.values:
            run_counts.add_metric([name, status], seen.get((name, status), 0))
    skew = _gauge("locks_clock_skew_seconds", "This host's clock minus the database's.", [])
    skew.add_metric([], (timezone.now() - db_now).total_seconds())
    return [last_success, next_slot, paused, incident, run_counts, duration, held, ticks, skew]
