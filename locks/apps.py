from django.apps import AppConfig
from django.db.backends.signals import connection_created


class LocksConfig(AppConfig):
    name = "locks"
    verbose_name = "Job locks"

    def ready(self) -> None:
        from locks import (  # noqa: F401
            checks,  # registers the system checks
            conf,  # applies the LOCKS_* defaults to django.conf.settings
        )
        from locks.db import watch_notices

        # The server's word that a COMMIT did not wait for its synchronous standby (rule 16).
        connection_created.connect(watch_notices, dispatch_uid="locks.db.watch_notices")
