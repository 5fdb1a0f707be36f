"""A copy of the scheduler stepping through DST nights, run as its own OS process by
tests/locks/test_dst_processes.py.

    python -m tests.locks.dst_worker --go DIR --copy N --copies K --night START END [--night ...]

The loop is ``locks.scheduler.Scheduler`` with its clock injected: for each night it is set to
START + 2 s, then every 30 minutes to END (UTC), and each time the loop takes one step (asks
every job whose slot came since its last step, through ``run_job``, on the database). Before
each step the copy waits for the K copies to reach it (a file per copy and step in DIR), so
that every slot is asked by K copies at once. It prints one JSON line: the results it saw.
"""

import argparse
import json
import os
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path

STEP = timedelta(minutes=30)


def instants(nights: list[list[str]]) -> list[datetime]:
    found = []
    for start, end in nights:
        moment, last = datetime.fromisoformat(start) + timedelta(seconds=2), datetime.fromisoformat(end)
        while moment <= last:
            found.append(moment)
            moment += STEP
    return found


def wait_for_all(go: Path, step: int, copies: int) -> None:
    deadline = time.monotonic() + 60
    while len(list(go.glob(f"*-{step}"))) < copies:
        if time.monotonic() > deadline:
            sys.exit(f"the other copies never reached step {step}")
        time.sleep(0.002)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--go", type=Path, required=True)
    parser.add_argument("--copy", type=int, required=True)
    parser.add_argument("--copies", type=int, required=True)
    parser.add_argument("--night", nargs=2, action="append", required=True, metavar=("START", "END"))
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tests.hostproject.settings")
    import django

    django.setup()
    from locks.registry import jobs
    from locks.scheduler import RUN_SCHEDULED, Scheduler

    clock = [datetime.fromisoformat(args.night[0][0])]
    seen = []

    def run(**kwargs):
        result = RUN_SCHEDULED(**kwargs)
        seen.append({"job": result.job, "tick": result.tick.isoformat(), "outcome": result.outcome.recorded})
        return result

    registered = jobs()
    scheduler = Scheduler(jobs=[registered["nightly"], registered["hourly"]], now=lambda: clock[0], run=run)
    for step, moment in enumerate(instants(args.night)):
        (args.go / f"{args.copy}-{step}").touch()
        wait_for_all(args.go, step, args.copies)
        clock[0] = moment
        scheduler.step()
    print(json.dumps(seen), flush=True)


if __name__ == "__main__":
    main()
