from locks import RunJobCommand


class Command(RunJobCommand):
    help = (
        "Email every due reminder once, at most one run per scheduled tick across every host. "
        "Exit 0 when it ran or skipped; 1 when a run that held the lock failed; 2 for bad arguments."
    )
    job_name = "send_reminders"
    dry_run_help = "Count due reminders; send nothing."
    dry_run_done = "dry run, nothing sent"
