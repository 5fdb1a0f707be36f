import argparse
import contextlib
import os
import signal
import sys
from datetime import UTC, datetime

from django.core.management.base import BaseCommand, CommandError
from django.db import Error as DBError  # DatabaseError and InterfaceError

from locks.checks import CHECK_TAG
from locks.crontab import CrontabEnvError, check_env_file
from locks.lease import LockError
from locks.operator import end_run_request
from locks.registry import NoDryRun, UnknownJob, get_job
from locks.runner import interrupt, run_due, run_job
from locks.schedule import InvalidTick


class Command(BaseCommand):
    """``run_job NAME``; a project's own command for one job subclasses it and sets ``job_name``
    (as ``sync_contests`` does): the same options, exit codes and log line, without the argument."""

    help = (
        "Run one job of LOCKS_JOBS under its lease, at most once per scheduled tick across every host. "
        "Exit 0 when it ran or skipped; 1 when a run that held the lock failed; 2 for bad arguments."
    )
    # Only the checks tagged `locks`: the others import every admin module (docs/benchmarks.md).
    requires_system_checks = [CHECK_TAG]
    job_name: str | None = None  # set by an alias: the job it runs
    dry_run_help = "Show what a run would do; write nothing (if the job can)."
    dry_run_done = "dry run, nothing written"
    stealth_options = ("slot",)  # a crontab pass's claimed slot (locks.crontab.run): no --tick's checks

    def add_arguments(self, parser) -> None:
        if self.job_name is None:
            parser.add_argument("job", help="A job name from LOCKS_JOBS, e.g. send_digest.")
        parser.add_argument("--force", action="store_true", help="Ignore the tick (still needs the lock).")
        parser.add_argument("--dry-run", action="store_true", help=self.dry_run_help)
        parser.add_argument(
            "--requested-by",
            default="cli",
            type=_requester,
            help=(
                "Who asks for this run, kept on its JobRun: cli (the default), cron, scheduler, trigger or "
                "admin:<user> (the admin's Run now passes it)."
            ),
        )
        parser.add_argument(
            "--tick",
            type=tick_argument,
            help=(
                "Claim this ISO 8601 slot of the schedule (UTC unless it names an offset) instead of "
                "the current one; a later slot than that only within the tick window of the database clock."
            ),
        )

    def handle(
        self, *args, force: bool, dry_run: bool, tick: datetime | None, requested_by: str = "cli", **options
    ) -> None:
        name = self.job_name or options["job"]
        try:
            check_env_file(os.environ)  # started from a crontab line: its file holds the secrets
        except CrontabEnvError as exc:
            raise CommandError(str(exc), returncode=2) from exc
        if force and tick:
            raise CommandError(
                "--force and --tick exclude each other: a forced run claims no tick.", returncode=2
            )
        try:
            job = get_job(name)
            if dry_run:
                if tick:  # refused as a run would refuse it; then unused
                    job.cron.check(tick)
                self.preview(name, expected=job.error_classes())
                return
            # A stopped pod, `kill` or Ctrl-C: the run is recorded and its lease released.
            signal.signal(signal.SIGTERM, _terminate)
            signal.signal(signal.SIGINT, _terminate)
            # Once; under catch_up "all" (without --tick or --force) also each slot still behind.
            status = 0  # the worst exit code of its runs (locks.models.ANSWERS)
            for result in (
                run_due(name=name, requested_by=requested_by, slot=options.get("slot"))
                if not (force or tick)
                else [run_job(name=name, tick=tick, force=force, requested_by=requested_by)]
            ):
                if options["verbosity"] >= 1:
                    self.stdout.write(result.describe())
                status = max(status, result.outcome.answer.exit_code)
            if force and requested_by.startswith("admin:"):  # the admin's Run now: its request is over
                with contextlib.suppress(DBError):
                    end_run_request(job=name, by=requested_by)
        except UnknownJob as exc:
            raise CommandError(exc.args[0], returncode=2) from exc
        except InvalidTick as exc:
            raise CommandError(f"--tick: {exc}", returncode=2) from exc
        except LockError as exc:
            raise CommandError(str(exc)) from exc
        if status:
            sys.exit(status)

    def preview(self, job: str, *, expected: tuple[type[BaseException], ...]) -> None:
        try:
            counts = get_job(job).preview()
        except NoDryRun as exc:
            raise CommandError(f"--dry-run: {exc}", returncode=2) from exc
        except (DBError, *expected) as exc:
            raise CommandError(f"dry run failed: {exc}") from exc
        self.stdout.write(f"{self.dry_run_done}: " + " ".join(f"{k}={v}" for k, v in counts.items()))


def _terminate(signum, frame) -> None:
    interrupt(SystemExit(128 + signum))  # held back while a run takes or records its lease


REQUESTERS = ("cli", "cron", "scheduler", "trigger")


def _requester(value: str) -> str:
    """One of REQUESTERS or ``admin:<user>`` (at most 200 characters, printable, no spaces)."""
    if value in REQUESTERS or (
        value.startswith("admin:") and 6 < len(value) <= 200 and value.isprintable() and " " not in value
    ):
        return value
    raise argparse.ArgumentTypeError(f"{value!r} is none of {', '.join(REQUESTERS)} or admin:<user>")


def tick_argument(value: str) -> datetime:
    """A ``--tick`` (or ``--reset-tick``) value: ISO 8601, read as UTC without an offset."""
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{value!r} is not an ISO 8601 date-time (e.g. 2026-11-30T14:00:00+00:00)"
        ) from None
    return parsed.replace(tzinfo=UTC) if parsed.tzinfo is None else parsed


# The base of a project's own command for one job (``from locks import RunJobCommand``).
RunJobCommand = Command
