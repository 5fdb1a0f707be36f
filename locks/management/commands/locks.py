import argparse
from datetime import datetime
from json import dumps

from django.core.management.base import BaseCommand, CommandError
from django.db import Error as DBError  # DatabaseError and InterfaceError
from django.utils.formats import date_format

from locks.conf import MAX_LEDGER_SLOTS
from locks.db import STANDBY, RowLocked, standby
from locks.lease import LockError, iso
from locks.management.commands.run_job import tick_argument
from locks.operator import cli_name, force_release, pause_job, resume_job
from locks.operator import reset_tick as reset_claimed_tick
from locks.registry import UnknownJob, get_job, timezone_of
from locks.schedule import OutOfRange, local_label, local_time
from locks.status import job_ledgers, job_states

MAX_NEXT = 1000  # slots `locks next` shows at most


class Command(BaseCommand):
    help = "Show job locks and their tick ledgers; force-release, pause or resume one."

    def add_arguments(self, parser) -> None:
        actions = parser.add_subparsers(
            dest="action", required=True, metavar="{status,release,pause,resume,ticks,next}"
        )
        status = actions.add_parser(
            "status", help="List every lock and its state, and the registered jobs that never ran."
        )
        status.add_argument("--json", action="store_true", help="Print JSON instead of a table.")
        release = actions.add_parser("release", help="Force-release a lock (bumps its fencing token).")
        release.add_argument("job", help="Job name, e.g. send_digest.")
        release.add_argument(
            "--token",
            type=int,
            help="Release only the lease with this fencing token (the one `locks status` showed).",
        )
        release.add_argument(
            "--reset-tick",
            type=tick_argument,
            metavar="TICK",
            help=(
                "Also clear the claimed tick, so the next scheduled run may claim any tick: only while it is "
                "still TICK, the one `locks status` showed (ISO 8601)."
            ),
        )
        pause = actions.add_parser(
            "pause", help="Pause a job cluster-wide: no copy runs it until it is resumed."
        )
        pause.add_argument("job", help="A registered job, e.g. send_digest.")
        pause.add_argument("--note", default="", help="Why; shown on every skip, in the admin and in status.")
        resume = actions.add_parser("resume", help="Resume a paused job: its next slot runs as usual.")
        resume.add_argument("job", help="A registered job.")
        ticks = actions.add_parser("ticks", help="A job's tick ledger: each recent slot and its one outcome.")
        ticks.add_argument("job", help="A registered job.")
        ticks.add_argument(
            "--last", type=_positive, help="Only the newest N slots (default LOCKS_LEDGER_SLOTS)."
        )
        ticks.add_argument(
            "--json", action="store_true", help="Print JSON (newest first) instead of a table."
        )

        upcoming = actions.add_parser(
            "next", help="A job's next slots, in UTC and in its time zone, marked where the DST rule applied."
        )
        upcoming.add_argument("job", help="A registered job.")
        upcoming.add_argument(
            "--count", type=_slot_count, default=10, help=f"How many slots (default 10, at most {MAX_NEXT})."
        )
        upcoming.add_argument(
            "--after",
            type=tick_argument,
            metavar="ISO8601",
            help="The slots after this instant (UTC unless it names an offset) instead of now.",
        )
        upcoming.add_argument("--json", action="store_true", help="Print JSON instead of a table.")

    def handle(self, *args, action: str, **options) -> None:
        try:
            getattr(self, action)(**options)  # one method per action, each taking its own options
        except (UnknownJob, OutOfRange) as exc:
            raise CommandError(exc.args[0], returncode=2) from exc
        except (LockError, RowLocked) as exc:  # a write in progress held the row past the bound
            raise CommandError(exc.args[0]) from exc
        except DBError as exc:
            cause = f"{STANDBY}: " if standby(exc) else ""  # its rows may be stale: not shown
            raise CommandError(f"cannot read the locks: {cause}{' '.join(str(exc).split())}") from exc

    def status(self, *, json: bool, **_) -> None:
        states = job_states()
        zones = {state.job: timezone_of(state.job) for state in states}
        if json:
            rows = [
                {**s.as_json(), "timezone": zones[s.job], "tick_local": _local(s.tick, zones[s.job])}
                for s in states
            ]
            self.stdout.write(dumps(rows, indent=2))
            return
        if not states:
            self.stdout.write("No locks and no jobs in LOCKS_JOBS: a job creates its lock on its first run.")
            return
        header = ("JOB", "STATE", "HOLDER", "TOKEN", "LOCKED UNTIL", "TICK", "LAST RUN", "FINISHED", "PAUSED")
        rows = [
            (
                s.job,
                s.state,
                s.holder or "-",
                str(s.token) if s.token is not None else "-",
                _fmt(s.locked_until),
                local_label(s.tick, tz=zones[s.job]) if s.tick else "-",
                s.last_run.status or "-",
                _fmt(s.last_run.finished_at),
                str(s.pause).removeprefix("paused ") if s.paused else "-",
            )
            for s in states
        ]
        widths = [max(len(row[i]) for row in [header, *rows]) for i in range(len(header))]
        for row in [header, *rows]:
            self.stdout.write(
                "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip()
            )

    def pause(self, *, job: str, note: str, **_) -> None:
        state = pause_job(job=job, by=cli_name(), note=note)
        self.stdout.write(f"{'Paused' if state.changed else 'Already paused'}: {state.describe()}.")

    def resume(self, *, job: str, **_) -> None:
        state = resume_job(job=job, by=cli_name())
        self.stdout.write(
            f"Resumed {job}: its next slot runs as usual." if state.changed else f"{job} was not paused."
        )

    def ticks(self, *, job: str, last: int | None, json: bool, **_) -> None:
        ledger = job_ledgers(jobs=[get_job(job)], slots=last)[job]
        zone = ledger.timezone
        if json:
            rows = [{**slot.as_json(), "local": _local(slot.tick, zone)} for slot in ledger.slots]
            self.stdout.write(dumps(rows, indent=2))
            return
        self.stdout.write(f"{'TICK (UTC)':<25}  {'LOCAL (' + zone + ')':<21}  {'OUTCOME':<9}  ATTEMPTS  RUNS")
        for slot in ledger.slots:
            runs = ", ".join(f"{run['status']} #{run['token']}" for run in slot.runs) or "-"
            local = local_label(slot.tick, tz=zone)
            self.stdout.write(
                f"{slot.tick.isoformat():<25}  {local:<21}  {slot.outcome:<9}  {slot.attempts:<8}  {runs}"
            )

    def next(self, *, job: str, count: int, after: datetime | None, json: bool, **_) -> None:
        found = get_job(job)
        slots = found.next_slots(after=after, count=count)
        if json:
            self.stdout.write(dumps([slot.as_json() for slot in slots], indent=2))
            return
        self.stdout.write(f"{found.name}: {found.cron.expression!r} in {found.cron.timezone}")
        self.stdout.write(f"{'SLOT (UTC)':<25}  {'LOCAL':<32}  DST")
        for slot in slots:
            local = f"{local_label(slot.slot, tz=found.cron.timezone)} ({slot.local:%z})"
            self.stdout.write(f"{slot.slot.isoformat():<25}  {local:<32}  {slot.dst or '-'}")

    def release(self, *, job: str, token: int | None, reset_tick: datetime | None, **_) -> None:
        by = cli_name()
        try:
            released = force_release(job=job, expected_token=token, by=by)
            if released.changed:
                self.stdout.write(
                    f"Released {job}: holder was {released.previous_holder} "
                    f"(token {released.previous_token}); new token {released.token}."
                )
            elif released.detail and token is not None and released.previous_token != token:
                raise CommandError(released.detail)  # another holder: leave its tick alone too
            elif released.detail:
                self.stdout.write(f"{released.detail}.")
            else:
                self.stdout.write(f"{job} was not held; nothing to release.")
            if reset_tick is not None:
                # The token shown, or the one this release left (it bumps the token).
                expected = released.token if released.changed else token
                cleared = reset_claimed_tick(
                    job=job, expected_tick=reset_tick, expected_token=expected, by=by
                )
                if cleared.changed:
                    done = "done" if cleared.was_done else "not done"
                    self.stdout.write(
                        f"Reset the claimed tick of {job}: it was {iso(cleared.previous_tick)} ({done})."
                    )
                elif cleared.detail:
                    raise CommandError(f"{cleared.detail}.")
                else:
                    self.stdout.write(f"{job} has no claimed tick; nothing to reset.")
        except (UnknownJob, LockError, RowLocked) as exc:
            raise CommandError(exc.args[0]) from exc


def _slots(most: int, refusal: str):
    """An argument type: a whole number of slots from 1 to ``most``, else ``refusal``."""

    def parse(value: str) -> int:
        try:
            number = int(value)
        except ValueError:
            number = 0
        if not 1 <= number <= most:
            raise argparse.ArgumentTypeError(refusal.format(value=value, most=most))
        return number

    return parse


_positive = _slots(MAX_LEDGER_SLOTS, "{value!r} is not a whole number of slots, 1 or more, at most {most}")
_slot_count = _slots(MAX_NEXT, "{value!r} is not a whole number of slots from 1 to {most}")


def _local(moment: datetime | None, zone: str) -> str | None:
    return local_time(moment, tz=zone).isoformat() if moment else None


def _fmt(value) -> str:
    return date_format(value, "Y-m-d H:i:sO") if value else "-"
