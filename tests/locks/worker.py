"""A contender for a lock, run as its own OS process by the multi-process tests.

    python -m tests.locks.worker --job J [--tick ISO] [--ttl S] [--go FILE] [--run S] [--write S] [--row]
        [--then S] [--retry S,S] [--hold FILE] [--on-failover rerun|pause]

Waits until FILE exists (a start line for every contender), then runs a job of
--run seconds through ``locks.run_locked`` (lease, heartbeat, JobRun); with
--write, the job then holds a fenced write transaction open for S seconds (with --row, after
inserting a ``SlotWrite`` row in it, then printing ``{"outcome": "writing"}``); with --then, once that
transaction committed it prints ``{"outcome": "committed"}`` and sleeps S seconds (a test
SIGKILLs it there). With --hold, the job waits until FILE exists before its write phase (a test
sets up a fault meanwhile); --on-failover goes to ``run_locked``. The
job prints ``{"outcome": "acquired", …}`` as soon as it holds the lease; the
process then prints one JSON line with the result.
"""

import argparse
import json
import os
import sys
import time
from datetime import datetime, timedelta
from pathlib import Path


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--job", required=True)
    parser.add_argument("--tick", type=datetime.fromisoformat)
    parser.add_argument("--ttl", type=float, default=30)
    parser.add_argument("--go")
    parser.add_argument("--run", type=float, default=0)
    parser.add_argument("--write", type=float, default=0)
    parser.add_argument("--then", type=float, default=0)
    parser.add_argument("--row", action="store_true")
    parser.add_argument("--hold")
    parser.add_argument("--on-failover", default="rerun")
    parser.add_argument(
        "--retry", type=lambda text: tuple(float(s) for s in text.split(",") if s), default=None
    )
    args = parser.parse_args()

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    import django

    django.setup()
    from locks.lease import ClaimRules, Lease, fenced
    from locks.runner import run_locked

    if args.go:
        deadline = time.monotonic() + 60
        while not Path(args.go).exists():
            if time.monotonic() > deadline:
                sys.exit("start line never came")
            time.sleep(0.005)

    def job(lease: Lease) -> dict:
        print(json.dumps({"outcome": "acquired", "token": lease.token, "holder": lease.holder}), flush=True)
        time.sleep(args.run)
        deadline = time.monotonic() + 60
        while args.hold and not Path(args.hold).exists():
            if time.monotonic() > deadline:
                sys.exit("the hold was never lifted")
            time.sleep(0.01)
        if args.write or args.then:
            with fenced(lease):
                if args.row:
                    from tests.jobsapp.models import SlotWrite

                    SlotWrite.objects.create(
                        job=lease.job, tick=lease.tick, token=lease.token, holder=lease.holder
                    )
                    print(json.dumps({"outcome": "writing", "token": lease.token}), flush=True)
                time.sleep(args.write)  # a long write: on SQLite it holds the one write lock
        if args.then:
            print(json.dumps({"outcome": "committed", "token": lease.token}), flush=True)
            time.sleep(args.then)
        return {"slept": args.run}

    delays = None if args.retry is None else tuple(timedelta(seconds=s) for s in args.retry)
    result = run_locked(
        job=args.job,
        tick=args.tick,
        ttl=timedelta(seconds=args.ttl),
        fn=job,
        retry_delays=delays,
        rules=ClaimRules(pause_on_failover=args.on_failover == "pause"),
    )
    print(
        json.dumps(
            {
                "outcome": result.outcome.recorded,
                "token": result.token,
                "timeline": result.grant.timeline,
                "holder": result.holder,
                "skip": result.skip.reason if result.skip else None,
                "attempt": result.grant.attempt,
                "reason": result.reason,
                "error": result.failure.error,
            }
        )
    )


if __name__ == "__main__":
    main()
