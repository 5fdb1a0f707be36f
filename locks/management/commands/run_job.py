import argparse
import signal
import sys
from datetime import UTC, datetime

from django.core.management.base import BaseCommand, CommandError
from django.db import Error as DBError  # DatabaseError and InterfaceError

from locks.api import LockError
from locks.registry import InvalidTick, Job, NoDryRun, UnknownJob, checked_tick, get_job, preview_job, run_job


class Command(BaseCommand):
    help = (
        "Run one job of LOCKS_JOBS under its lease, at most once per scheduled tick across every host. "
        "Exit 0 when it ran or skipped; 1 when a run that held the lock failed; 2 for bad arguments."
    )

    def add_arguments(self, parser) -> None:
        parser.add_argument("job", help="A job name from LOCKS_JOBS, e.g. sync_contests.")
        parser.add_argument("--force", action="store_true", help="Ignore the tick (still needs the lock).")
        parser.add_argument(
            "--dry-run", action="store_true", help="Show what a run would do; write nothing (if the job can)."
        )
        parser.add_argument(
            "--tick",
            type=_tick,
            help=(
                "Claim this ISO 8601 slot of the schedule (UTC unless it names an offset) instead of "
                "the current one; at most one schedule period ahead of the database clock."
            ),
        )

    def handle(self, *args, job: str, force: bool, dry_run: bool, tick: datetime | None, **options) -> None:
        if force and tick:
            raise CommandError(
                "--force and --tick exclude each other: a forced run claims no tick.", returncode=2
            )
        try:
            registered = get_job(job)
        except UnknownJob as exc:
            raise CommandError(exc.args[0], returncode=2) from exc
        if dry_run:
            if tick:
                self.check_tick(registered, tick)  # refused as a run would refuse it; then unused
            self.preview(registered.name, expected=registered.error_classes())
            return
        # A stopped pod or `kill` ends the run through Python, so the lease is released
        # and the run recorded instead of left to expire.
        signal.signal(signal.SIGTERM, _terminate)
        try:
            result = run_job(name=job, tick=tick, force=force)
        except InvalidTick as exc:
            raise CommandError(f"--tick: {exc}", returncode=2) from exc
        except LockError as exc:
            raise CommandError(str(exc)) from exc
        if options["verbosity"] >= 1:
            self.stdout.write(result.describe())
        if not result.ok:
            sys.exit(1)

    def check_tick(self, job: Job, tick: datetime) -> None:
        try:
            checked_tick(job, tick)
        except InvalidTick as exc:
            raise CommandError(f"--tick: {exc}", returncode=2) from exc

    def preview(self, job: str, *, expected: tuple[type[BaseException], ...]) -> None:
        try:
            counts = preview_job(name=job)
        except NoDryRun as exc:
            raise CommandError(f"--dry-run: {exc}", returncode=2) from exc
        except (DBError, *expected) as exc:
            raise CommandError(f"dry run failed: {exc}") from exc
        self.stdout.write("dry run, nothing written: " + " ".join(f"{k}={v}" for k, v in counts.items()))


def _terminate(signum, frame) -> None:
    raise SystemExit(128 + signum)


def _tick(value: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an ISO 8601 date-time (e.g. 2026-11-30T14:00:00+00:00)"
        ) from None
    # Slots are UTC (locks.schedule), so a tick without an offset is read as UTC.
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed
