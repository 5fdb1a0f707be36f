"""The contests app's metric family for ``/metrics`` (``LOCKS_METRICS_COLLECTORS`` names it):
reminders by delivery state, from one aggregate query at scrape time."""

from __future__ import annotations

from django.db.models import Count, Q
from prometheus_client.core import GaugeMetricFamily

from contests.models import Reminder


def reminder_metrics() -> list[GaugeMetricFamily]:
    counts = Reminder.objects.aggregate(
        pending=Count("pk", filter=Q(delivered_at__isnull=True, failed_at__isnull=True)),
        delivered=Count("pk", filter=Q(delivered_at__isnull=False)),
        failed=Count("pk", filter=Q(delivered_at__isnull=True, failed_at__isnull=False)),
    )
    family = GaugeMetricFamily(
        "contests_reminders", "Reminders by delivery state: pending, delivered, failed.", labels=["state"]
    )
    for state in ("pending", "delivered", "failed"):
        family.add_metric([state], counts[state])
    return [family]
