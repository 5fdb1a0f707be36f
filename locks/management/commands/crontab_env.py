import os
from pathlib import Path

from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from locks.crontab import CrontabEnvError, crontab_environment, write_crontab_env


class Command(BaseCommand):
    help = (
        "Write the variables a job reads (LOCKS_CRONTAB_ENV_VARIABLES) from the current environment to "
        "LOCKS_CRONTAB_ENV_FILE (mode 0600), which the line `crontab add` installs sources. "
        "Run it before `crontab add`."
    )

    def handle(self, *args, **options) -> None:
        if not settings.LOCKS_CRONTAB_ENV_FILE:
            raise CommandError("LOCKS_CRONTAB_ENV_FILE is not set: name the file the crontab line sources")
        path = Path(settings.LOCKS_CRONTAB_ENV_FILE)
        try:
            variables = crontab_environment(environ=os.environ, names=settings.LOCKS_CRONTAB_ENV_VARIABLES)
            write_crontab_env(path=path, variables=variables)
        except CrontabEnvError as exc:
            raise CommandError(f"{path}: {exc}") from exc
        except OSError as exc:
            raise CommandError(f"cannot write {path}: {exc.strerror or exc}") from exc
        self.stdout.write(f"wrote {len(variables)} variables to {path} (mode 0600): {' '.join(variables)}")
