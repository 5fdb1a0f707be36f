from locks import RunJobCommand


class Command(RunJobCommand):
    help = (
        "Sync the Codeforces contest list, at most once per scheduled tick across every host. "
        "Exit 0 when it synced or skipped; 1 when a sync that held the lock failed; 2 for bad arguments."
    )
    job_name = "sync_contests"
    dry_run_help = "Fetch and count; write nothing."
