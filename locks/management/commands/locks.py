import json

from django.core.management.base import BaseCommand, CommandError
from django.db import Error as DBError  # DatabaseError and InterfaceError

from locks import api
from locks.selectors import job_states


class Command(BaseCommand):
    help = "Show job locks, or force-release one."

    def add_arguments(self, parser) -> None:
        actions = parser.add_subparsers(dest="action", required=True, metavar="{status,release}")
        status = actions.add_parser(
            "status", help="List every lock and its state, and the registered jobs that never ran."
        )
        status.add_argument("--json", action="store_true", help="Print JSON instead of a table.")
        release = actions.add_parser("release", help="Force-release a lock (bumps its fencing token).")
        release.add_argument("job", help="Job name, e.g. sync_contests.")

    def handle(self, *args, action: str, **options) -> None:
        try:
            if action == "release":
                self.release(options["job"])
            else:
                self.status(as_json=options["json"])
        except DBError as exc:
            raise CommandError(f"cannot read the locks: {' '.join(str(exc).split())}") from exc

    def status(self, *, as_json: bool) -> None:
        states = job_states()
        if as_json:
            self.stdout.write(json.dumps([state.as_json() for state in states], indent=2))
            return
        if not states:
            self.stdout.write("No locks and no jobs in LOCKS_JOBS: a job creates its lock on its first run.")
            return
        header = ("JOB", "STATE", "HOLDER", "TOKEN", "LOCKED UNTIL", "TICK", "LAST RUN", "FINISHED")
        rows = [
            (
                s.job,
                s.state,
                s.holder or "-",
                str(s.token) if s.token is not None else "-",
                _fmt(s.locked_until),
                _fmt(s.tick),
                s.last_status or "-",
                _fmt(s.last_finished_at),
            )
            for s in states
        ]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            self.stdout.write(
                "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            )

    def release(self, job: str) -> None:
        try:
            released = api.force_release(job=job, by="manage.py locks release")
        except api.UnknownJob as exc:
            raise CommandError(exc.args[0]) from exc
        if released.was_held:
            self.stdout.write(
                f"Released {job}: holder was {released.previous_holder} "
                f"(token {released.previous_token}); new token {released.token}."
            )
        else:
            self.stdout.write(f"{job} was not held; nothing to release.")


def _fmt(value) -> str:
    return value.strftime("%Y-%m-%d %H:%M:%S%z") if value else "-"
