from django.conf import settings
from django.core.management.base import BaseCommand, CommandError

from locks.checks import CHECK_TAG
from locks.registry import UnknownJob, get_job, jobs
from locks.scheduler import Scheduler, install_signal_handlers


class Command(BaseCommand):
    help = (
        "Run every job of LOCKS_JOBS at its slots until SIGTERM or SIGINT. Safe to run in every "
        "replica: the lease lets one copy run each tick, the others skip and say why."
    )
    # The checks tagged `locks`, as run_job: `manage.py check` adds the rest, among them each
    # schedule's slot check (locks.E026), so one job's impossible schedule never stops the others.
    requires_system_checks = [CHECK_TAG]

    def add_arguments(self, parser) -> None:
        parser.add_argument("jobs", nargs="*", metavar="JOB", help="Only these jobs (default: every one).")

    def handle(self, *args, **options) -> None:
        names = options["jobs"]
        try:
            chosen = [get_job(name) for name in names] if names else list(jobs().values())
        except UnknownJob as exc:
            raise CommandError(exc.args[0], returncode=2) from exc
        scheduler = Scheduler(chosen, workers=settings.LOCKS_SCHEDULER_WORKERS, claim=True)
        install_signal_handlers(scheduler)
        names = ", ".join(job.name for job in chosen)
        self.stderr.write(f"scheduler: running {names}; SIGTERM or Ctrl-C stops it")
        scheduler.run_forever()
        self.stderr.write("scheduler: stopped")
