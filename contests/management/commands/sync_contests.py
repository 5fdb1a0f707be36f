import argparse
import signal
import sys
from datetime import UTC, datetime

from django.core.checks import Tags
from django.core.management.base import BaseCommand, CommandError
from django.db import Error as DBError  # DatabaseError and InterfaceError

from contests.codeforces import CodeforcesError
from contests.jobs import InvalidTick, checked_tick, preview_sync, run_sync_job, tick_ahead_message
from locks.api import LockError


class Command(BaseCommand):
    help = (
        "Sync the Codeforces contest list, at most once per scheduled tick across every host. "
        "Exit 0 when it synced or skipped; 1 when a sync that held the lock failed; 2 for bad arguments."
    )
    # The project's own configuration checks (locks, contests, ops) still run; the URL
    # and admin checks would import every admin module on each hourly start (about
    # 23 ms of a skipping copy's ~250 ms, docs/benchmarks.md).
    requires_system_checks = [Tags.compatibility]

    def add_arguments(self, parser) -> None:
        parser.add_argument("--force", action="store_true", help="Ignore the tick (still needs the lock).")
        parser.add_argument("--dry-run", action="store_true", help="Fetch and count; write nothing.")
        parser.add_argument(
            "--tick",
            type=_tick,
            help=(
                "Claim this ISO 8601 slot of the schedule (UTC unless it names an offset) instead of "
                "the current one; at most one schedule period ahead of the database clock."
            ),
        )

    def handle(self, *args, force: bool, dry_run: bool, tick: datetime | None, **options) -> None:
        if force and tick:
            raise CommandError(
                "--force and --tick exclude each other: a forced run claims no tick.", returncode=2
            )
        if tick:
            try:
                tick = checked_tick(tick)
            except InvalidTick as exc:
                raise CommandError(f"--tick: {exc}", returncode=2) from exc
        if dry_run:
            try:
                counts = preview_sync()
            except (CodeforcesError, DBError) as exc:
                raise CommandError(f"dry run failed: {exc}") from exc
            self.stdout.write("dry run, nothing written: " + " ".join(f"{k}={v}" for k, v in counts.items()))
            return
        # A stopped pod or `kill` ends the run through Python, so the lease is released
        # and the run recorded instead of left to expire.
        signal.signal(signal.SIGTERM, _terminate)
        try:
            result = run_sync_job(tick=tick, force=force)
        except LockError as exc:
            raise CommandError(str(exc)) from exc
        if tick and result.skip is not None and result.skip.reason == "tick_ahead":
            raise CommandError(f"--tick: {tick_ahead_message(result.skip)}", returncode=2)
        if options["verbosity"] >= 1:
            self.stdout.write(result.describe())
        if not result.ok:
            sys.exit(1)


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
