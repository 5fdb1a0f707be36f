from django.apps import AppConfig


class LocksConfig(AppConfig):
    name = "locks"
    verbose_name = "Job locks"

    def ready(self) -> None:
        from locks import (  # noqa: F401
            checks,  # registers the system checks
            conf,  # applies the LOCKS_* defaults to django.conf.settings
        )
