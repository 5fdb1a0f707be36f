import os
import signal

from django.apps import AppConfig
from django.db.models.signals import post_save


class JobsAppConfig(AppConfig):
    """A host project's own app for the tests: a job that writes under the fencing token."""

    default = True  # this module has two configs: INSTALLED_APPS' "tests.jobsapp" is this one
    name = "tests.jobsapp"
    label = "jobsapp"
    default_auto_field = "django.db.models.BigAutoField"

    def ready(self) -> None:
        if os.environ.get(
            "JOBSAPP_SIGNAL_AT_RUN_START"
        ):  # a stop (SIGTERM, SIGINT) as the run records its start
            post_save.connect(_signal_self, sender="locks.JobRun", dispatch_uid="jobsapp.signal")


class MongoJobsAppConfig(JobsAppConfig):
    """The same app on MongoDB (the soak's ``--db mongodb``): ObjectId keys, and its collection
    made by ``migrate --run-syncdb`` (its SQL migration creates an integer id)."""

    default = False
    default_auto_field = "django_mongodb_backend.fields.ObjectIdAutoField"


def _signal_self(sender, created, **kwargs) -> None:
    if created:
        os.kill(os.getpid(), signal.Signals[os.environ["JOBSAPP_SIGNAL_AT_RUN_START"]])
