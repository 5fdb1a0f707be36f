"""The contests app's metric family for ``/metrics`` (``LOCKS_METRICS_COLLECTORS`` names it):
reminders by delivery state, as the admin shows it (``contests.admin.delivery_state``:
delivered, else uncertain, else failed, else pending), from one aggregate query at scrape time."""

from __future__ import annotations

from django.db.models import Count, Q
from prometheus_client.core import GaugeMetricFamily

from contests.models import OUTSTANDING, Reminder

NOT_DELIVERED = Q(delivered_at__isnull=True)
STATES = {
    "pending": OUTSTANDING,
    "delivered": ~NOT_DELIVERED,
    "uncertain": NOT_DELIVERED & Q(uncertain_at__isnull=False),
    "failed": NOT_DELIVERED & Q(uncertain_at__isnull=True, failed_at__isnull=False),
}


def reminder_metrics() -> list[GaugeMetricFamily]:
    counts = Reminder.objects.aggregate(**{state: Count("pk", filter=rows) for state, rows in STATES.items()})
    family = GaugeMetricFamily(
        "contests_reminders",
        "Reminders by delivery state: pending, delivered, uncertain (the mail server's answer was lost), "
        "failed.",
        labels=["state"],
    )
    for state in STATES:
        family.add_metric([state], counts[state])
    return [family]
