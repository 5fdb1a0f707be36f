"""``locks.contrib.alerts``: ``check_jobs`` and its incidents, an optional app a project adds to
``INSTALLED_APPS`` after ``locks`` (docs/jobs.md, "Alerts"). Without it no job is watched, and
/healthz, /metrics and the admin show no incident (``locks.status.open_incidents``)."""

from django.apps import AppConfig
from django.conf import settings
from django.core.checks import Warning, register

NO_RECIPIENT = "check_jobs is enabled but ADMINS is empty: its alert emails have nobody to go to."
NO_RECIPIENT_HINT = (
    "Set ADMINS (e.g. DJANGO_ADMINS) to who is on call, or LOCKS_CHECK_JOBS = False to turn the alerts off."
)


class AlertsConfig(AppConfig):
    name = "locks.contrib.alerts"
    label = "locks_alerts"
    verbose_name = "Job alerts"

    def ready(self) -> None:
        register(check_alert_recipients, deploy=True)

    def open_incidents(self, *, jobs=None) -> list:
        """What ``locks.status.open_incidents`` asks each app: its incidents open now (of ``jobs``)."""
        from locks.status import OpenIncident

        found = self.get_model("Incident").objects.open()
        found = found if jobs is None else found.filter(job_name__in=list(jobs))
        return [OpenIncident(i.job_name, i.reason, i.summary, i.opened_at, i.opening_email) for i in found]


def check_alert_recipients(app_configs=None, **kwargs) -> list[Warning]:
    """check_jobs emails ADMINS: with none, an incident would reach nobody (still ``locks.W005``)."""
    from locks.registry import job_settings

    if isinstance(entries := job_settings(), dict) and "check_jobs" in entries and not settings.ADMINS:
        return [Warning(NO_RECIPIENT, hint=NO_RECIPIENT_HINT, id="locks.W005")]
    return []
