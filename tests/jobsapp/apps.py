from django.apps import AppConfig


class JobsAppConfig(AppConfig):
    """A host project's own app for the tests: a job that writes under the fencing token."""

    name = "tests.jobsapp"
    label = "jobsapp"
    default_auto_field = "django.db.models.BigAutoField"
