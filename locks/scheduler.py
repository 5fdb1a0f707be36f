"""``run_scheduler``: run every registered job at its slots, in every replica.

The lease decides which copy runs a tick; this loop only decides *when* to ask: at
each slot, after a failed run by the job's retry policy, and after a held lease would
have expired (docs/architecture.md, "The scheduler"). It never raises for a job's sake.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from datetime import datetime, timedelta
from functools import partial

from django.db import close_old_connections, reset_queries
from django.utils import timezone

from locks import schedule
from locks.registry import Job
from locks.runner import RunResult, run_job
from locks.schedule import InvalidTick

logger = logging.getLogger(__name__)

# The longest the loop sleeps without looking at the clock again, so a host clock
# that jumps (NTP step, a suspended VM) is noticed within this long.
MAX_SLEEP = timedelta(seconds=60)
# Each run it asks for is recorded as the scheduler's (JobRun.requested_by).
RUN_SCHEDULED = partial(run_job, requested_by="scheduler")


@dataclass
class _Plan:
    """What the scheduler knows of one job: the tick it last asked for, and when to ask again."""

    job: Job
    tick: datetime | None = None
    retries_left: tuple[timedelta, ...] = ()
    again_at: datetime | None = None


class Scheduler:
    """The loop, with its clock and its waiting injected so that tests can run it fast."""

    def __init__(
        self,
        *,
        jobs: Iterable[Job],
        now: Callable[[], datetime] = timezone.now,
        run: Callable[..., RunResult] = RUN_SCHEDULED,
        stop: threading.Event | None = None,
    ) -> None:
        self.plans = [_Plan(job) for job in jobs]
        self.now = now
        self.run = run
        self.stop = stop or threading.Event()
        self.running: str | None = None  # the job running now, for the signal handler

    def step(self) -> None:
        """One wake: ask for every job whose current slot was not asked for yet, and
        for every retry that is due."""
        for plan in self.plans:
            if self.stop.is_set():
                return
            now = self.now()
            # The tick window lets a copy that starts a little early name the slot its
            # peers name; the scheduler itself waits for the slot's own time.
            tick = schedule.slot_at_or_before(plan.job.schedule, now=now)
            if tick != plan.tick:
                plan.tick, plan.retries_left, plan.again_at = tick, plan.job.retry_delays, None
            elif plan.again_at is None or plan.again_at > now:
                continue
            self._ask(plan)

    def next_wake(self) -> datetime:
        """The earliest slot or retry of any job, and no later than MAX_SLEEP from now."""
        now = self.now()
        wakes = [now + MAX_SLEEP]
        for plan in self.plans:
            wakes.append(schedule.next_tick(plan.job.schedule, now=now))
            if plan.again_at is not None:
                wakes.append(plan.again_at)
        return min(wakes)

    def run_forever(
        self, *, wait: Callable[[float], object] | None = None, iterations: int | None = None
    ) -> None:
        """Loop until ``stop`` is set (SIGTERM, SIGINT) or after ``iterations`` wakes."""
        wait = wait or self.stop.wait
        done = 0
        while not self.stop.is_set() and (iterations is None or done < iterations):
            self.step()
            delay = (self.next_wake() - self.now()).total_seconds()
            if delay > 0 and not self.stop.is_set():
                wait(delay)
            done += 1

    def _ask(self, plan: _Plan) -> None:
        # A connection idle since the last tick may have been closed by the server, and
        # with DEBUG on every query would be kept: what a request's end does for a view.
        close_old_connections()
        reset_queries()
        job, tick = plan.job, plan.tick
        self.running = job.name
        try:
            result = self.run(name=job.name, tick=tick)
        except InvalidTick:
            # The tick is more than a period ahead of the database clock: this host's
            # clock is fast. run_locked logged the WARNING with its offset; nothing was
            # stored, and the next slot is asked for as usual.
            plan.again_at = None
            return
        except Exception:  # a bug in a job's wrapper or the lock: logged, and the loop goes on
            logger.exception("scheduler: job=%s tick=%s raised; the loop goes on", job.name, tick.isoformat())
            result = None
        finally:
            self.running = None
        plan.again_at = self._again_at(plan, result)
        if plan.again_at is not None:
            logger.info(
                "scheduler: job=%s tick=%s outcome=%s; asking again at %s",
                job.name,
                tick.isoformat(),
                result.outcome if result else "error",
                plan.again_at.isoformat(timespec="seconds"),
            )

    def _again_at(self, plan: _Plan, result: RunResult | None) -> datetime | None:
        """When to ask for the same tick again, or None; never at or after the next slot."""
        now = self.now()
        if result is None or result.outcome in {"failed", "lost_lock"}:
            if not plan.retries_left:
                return None
            delay, plan.retries_left = plan.retries_left[0], plan.retries_left[1:]
            again = now + delay
        elif result.outcome == "skipped" and result.skip is not None and result.skip.reason == "held":
            # Another copy runs this tick. If it dies, its lease expires and the tick
            # may be taken again: look once more just after that.
            until = result.skip.locked_until
            if until is None:
                return None
            again = max(until, now) + timedelta(seconds=1)
        else:
            return None  # succeeded, done elsewhere, or the database is unreachable (one WARNING a tick)
        return again if again < schedule.next_tick(plan.job.schedule, now=plan.tick) else None


def install_signal_handlers(scheduler: Scheduler, *, grace: float) -> None:
    """SIGTERM and SIGINT stop the waiting at once. A job that is running gets ``grace``
    seconds to finish; then SystemExit is raised inside it, which run_locked records
    (the lease released, the run recorded as failed: ``interrupted: SystemExit: 0``)
    before the loop ends."""

    def give_up(signum, frame) -> None:
        if scheduler.running is not None:
            raise SystemExit(0)

    def stop(signum, frame) -> None:
        if scheduler.stop.is_set():
            return
        scheduler.stop.set()
        if scheduler.running is not None:
            logger.warning(
                "scheduler: %s received; job=%s may finish within %.0f s",
                signal.Signals(signum).name,
                scheduler.running,
                grace,
            )
            signal.signal(signal.SIGALRM, give_up)
            signal.setitimer(signal.ITIMER_REAL, max(grace, 0.001))

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
