import signal
import sys

from django.core.management.base import BaseCommand, CommandError
from django.db import Error as DBError  # DatabaseError and InterfaceError

from contests.reminder_job import preview_reminders, run_reminders_job
from locks.api import LockError


class Command(BaseCommand):
    help = (
        "Email every due reminder once, at most one run per scheduled tick across every host. "
        "Exit 0 when it ran or skipped; 1 when a run that held the lock failed; 2 for bad arguments."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("--force", action="store_true", help="Ignore the tick (still needs the lock).")
        parser.add_argument("--dry-run", action="store_true", help="Count due reminders; send nothing.")

    def handle(self, *args, force: bool, dry_run: bool, **options) -> None:
        if dry_run:
            try:
                counts = preview_reminders()
            except DBError as exc:
                raise CommandError(f"dry run failed: {exc}") from exc
            self.stdout.write("dry run, nothing sent: " + " ".join(f"{k}={v}" for k, v in counts.items()))
            return
        # A stopped pod or `kill` ends the run through Python: the lease is released and
        # the run recorded; a reminder claimed mid-send waits for its claim to expire.
        signal.signal(signal.SIGTERM, _terminate)
        try:
            result = run_reminders_job(force=force)
        except LockError as exc:
            raise CommandError(str(exc)) from exc
        if options["verbosity"] >= 1:
            self.stdout.write(result.describe())
        if not result.ok:
            sys.exit(1)


def _terminate(signum, frame) -> None:
    raise SystemExit(128 + signum)
