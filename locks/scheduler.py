"""``run_scheduler``'s loop: *when* to ask for each job's slots, each ask in a pool's worker (or a
child of its own); the lease decides which copy runs one (docs/architecture.md, "The scheduler")."""

from __future__ import annotations

import atexit
import contextlib
import heapq
import logging
import multiprocessing
import os
import select
import signal
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, replace
from datetime import UTC, datetime, timedelta
from functools import partial
from multiprocessing.connection import wait as wait_for_any

from django.conf import settings
from django.db import Error as DBError
from django.db import connections, reset_queries, router
from django.utils import timezone

from locks import runner
from locks.db import error_text
from locks.lease import RETRIED, Held, make_holder, renew_all
from locks.models import Outcome, SyncLock, Tick
from locks.registry import SLOT_ERRORS, Job
from locks.runner import SETTLED, Failure, Lost, RunResult, interrupt, run_job
from locks.schedule import InvalidTick
from locks.tasks import sweep

logger = logging.getLogger(__name__)

# The longest the loop sleeps without looking at the clock (a host clock that jumps is noticed).
MAX_SLEEP = timedelta(seconds=60)
# Each run it asks for is recorded as the scheduler's (JobRun.requested_by).
RUN_SCHEDULED = partial(run_job, requested_by="scheduler")
# While a paused job's slot lasts, how often its lock row is read for a resume.
PAUSED_POLL = timedelta(seconds=5)
# Asked again after an unreachable database or a locked lock row: 1 s, doubling, at most 30 s.
BACKOFF_FIRST, BACKOFF_MOST = timedelta(seconds=1), timedelta(seconds=30)
# How long an ask waits for a busy pool's worker while none answers (``BUSY``) and in all (``BUSY_MOST``),
# before it runs in a child of its own.
BUSY, BUSY_MOST = 1.0, 10.0
# After the grace, how long an interrupted run has to record itself before it is killed.
INTERRUPTED_WAIT = 10.0
EARLIEST = datetime.min.replace(tzinfo=UTC)
NO_SLOT = "scheduler: job=%s outcome=failed: its schedule %r has no slot that can be computed (%s: %s); the other jobs go on"
CLAIMED_ELSEWHERE = "scheduler: job=%s tick=%s holder=%s outcome=skipped reason=claimed by another copy"
ASKING_AGAIN = "scheduler: job=%s tick=%s outcome=%s; asking again at %s"


def _broke(name: str, due: datetime | None, why: str) -> RunResult:
    """An ask that came to no run: its run raised, or its process died (logged where it happened)."""
    return RunResult(job=name, tick=due, holder="", outcome=Outcome.BROKE, failure=Failure(why))


def _unstarted(plan: _Plan, due: datetime, exc: OSError) -> RunResult:
    why = f"no process could be started for its run ({error_text(exc)})"
    logger.warning("scheduler: job=%s: %s", plan.job.name, why)
    return _broke(plan.job.name, due, why)


@dataclass
class _Plan:
    """What the scheduler knows of one job: the slot it last asked for, when to ask again."""

    job: Job
    index: int  # its place among the jobs: the due ones of a wake are looked at in that order
    tick: datetime | None = None  # the latest slot at or before now, when last asked
    again_at: datetime | None = None
    backoff: timedelta = timedelta(0)
    running: bool = False
    paused: bool = False  # its last ask was skipped for a pause: look for a resume first
    claimed: bool = False  # its tick's row names this copy (claim before spawn)
    refused: datetime | None = None  # the tick whose claim another copy held when last asked (told once)
    # When to look at it next; None: its slots cannot be computed, so only once the clock goes back.
    look_at: datetime | None = EARLIEST


def paused_in_database(name: str) -> bool:
    """Whether the job's lock row says it is paused (False when it cannot be read: the run says why)."""
    try:
        return SyncLock.objects.for_job(name).filter(paused_at__isnull=False).exists()
    except DBError:
        return False


def ask(run: Callable[..., RunResult], *, name: str, due: datetime) -> RunResult:
    """One ask: ``run(name=, due=)``, a ``RunResult`` whatever happens."""
    try:
        return run(name=name, due=due)
    except InvalidTick as exc:  # this host's clock is fast: run_locked logged the WARNING
        return RunResult(job=name, tick=due, holder="", outcome=Outcome.REFUSED, reason=f"refused: {exc}")
    except Exception as exc:  # a bug in a job's wrapper or the lock: logged, and the loop goes on
        logger.exception("scheduler: job=%s tick=%s raised; the loop goes on", name, due.isoformat())
        return _broke(name, due, error_text(exc))


class Inline:
    """Each ask in this process, one after another (for tests on a fake clock)."""

    def __init__(self, run: Callable[..., RunResult] = run_job) -> None:
        self.run = run

    def start(self, plan: _Plan, *, due: datetime) -> RunResult:
        return ask(self.run, name=plan.job.name, due=due)

    def collect(self, seconds: float, *, wake: int | None = None) -> list[tuple[_Plan, RunResult]]:
        if seconds > 0 and wake is not None:
            wait_for_any([wake], timeout=seconds)  # nothing runs in the background: only wait
        return []

    def running(self) -> list[_Plan]:
        return []


class Forked:
    """Each ask in a forked child (``_child``), which sends its ``RunResult`` back; the leases its
    children hold are renewed here, all in one statement a beat (``locks.lease.renew_all``)."""

    def __init__(self, run: Callable[..., RunResult] = run_job) -> None:
        self.run = run
        self.children: dict[int, tuple[_Plan, multiprocessing.Process, object]] = {}
        self.context = multiprocessing.get_context("fork")
        self.tell: dict[int, object] = {}  # by the reader's fileno: the pipe to that child
        self.leases: dict[int, Held] = {}  # by the reader's fileno: the lease its run holds
        self.beat_at = 0.0  # when to renew them next (time.monotonic())

    def start(self, plan: _Plan, *, due: datetime) -> RunResult | None:
        """None once its run is started; an ask that came to no run if no process could be started."""
        reader, writer = self.context.Pipe(duplex=False)
        try:
            child = self._fork(_child, reader, writer, plan.job.name, due, name=f"run-{plan.job.name}")
        except OSError as exc:
            return _unstarted(plan, due, exc)
        self.children[reader.fileno()] = (plan, child, reader)
        return None

    def _fork(self, target, ours, theirs, *args, name: str) -> multiprocessing.Process:
        """``target(run, *args, pipes)``, forked; ``self.tell[ours]`` tells it of a lease lost."""
        told, tell = self.context.Pipe(duplex=False)
        connections.close_all()  # no connection of this process is shared with the child
        pipes = (theirs, told, os.getpid())  # to and from the scheduler, and its pid
        process = self.context.Process(target=target, args=(self.run, *args, pipes), name=name)
        try:
            process.start()
        except OSError:  # the pid limit (EAGAIN), no memory
            for end in (ours, theirs, told, tell):
                end.close()
            raise
        theirs.close()
        told.close()
        self.tell[ours.fileno()] = tell
        return process

    def collect(self, seconds: float, *, wake: int | None = None) -> list[tuple[_Plan, RunResult]]:
        """The runs that ended within ``seconds`` (at once, if any has); sooner on a byte at ``wake``."""
        readers = [reader for _plan, _child, reader in self.children.values()]
        if self.leases:
            seconds = min(seconds, self.beat_at - time.monotonic())
        ready = wait_for_any(readers + ([wake] if wake is not None else []), timeout=max(seconds, 0))
        finished = []
        for reader in ready:
            if reader == wake:
                with contextlib.suppress(BlockingIOError):
                    os.read(wake, 64)
                continue
            try:
                outcome, answered = reader.recv(), True
            except (EOFError, OSError):
                why, answered = "its run's process ended without an answer", False
                outcome = None
            if self._held(reader.fileno(), outcome):
                continue
            plan, child, _reader = self.children.pop(reader.fileno())
            self.leases.pop(reader.fileno(), None)
            if not answered:
                logger.warning("scheduler: job=%s: %s", plan.job.name, why)
                outcome = _broke(plan.job.name, None, why)
            self._done(child, reader, answered=answered)
            finished.append((plan, outcome))
        self._beat()
        return finished

    def _held(self, fileno: int, told) -> bool:
        """Whether ``told`` is news of the lease a run holds (``Held``) or no longer holds (``Lost``)."""
        if isinstance(told, Held):
            beat_at = time.monotonic() + told.ttl.total_seconds() / 3
            self.beat_at = min(self.beat_at, beat_at) if self.leases else beat_at
            self.leases[fileno] = told
        elif isinstance(told, Lost):
            self.leases.pop(fileno, None)
        return isinstance(told, Held | Lost)

    def _beat(self) -> None:
        """Every TTL/3 (the shortest of theirs) while runs hold leases: renew them all, and tell each
        run whose lease was lost (docs/architecture.md, "The rules": 5)."""
        now = time.monotonic()
        if not self.leases or now < self.beat_at:
            return
        leases = dict(self.leases)
        _reuse_connections()  # not one the server closed since the last beat (a restart, a failover)
        try:
            lost = renew_all(list(leases.values()))
        except DBError as exc:
            if connections[router.db_for_write(SyncLock)].vendor == "sqlite" and "locked" in str(exc):
                logger.debug("scheduler: heartbeat: %s; trying again at the next beat", error_text(exc))
                lost = {}  # a write holds SQLite's one lock: renewed by it, if it is the run's own
            else:
                why = f"heartbeat could not renew the lease: {error_text(exc)}"
                lost = dict.fromkeys(leases.values(), why)
        logger.debug("scheduler: heartbeat: %d of %d leases renewed", len(leases) - len(lost), len(leases))
        for fileno, held in leases.items():
            if held in lost:
                del self.leases[fileno]
                with contextlib.suppress(OSError):
                    self.tell[fileno].send(Lost(held.job, held.token, lost[held]))
        self.beat_at = now + min((held.ttl.total_seconds() / 3 for held in self.leases.values()), default=0)

    def _done(self, child: multiprocessing.Process, reader, *, answered: bool) -> None:
        self.tell.pop(reader.fileno()).close()
        reader.close()
        child.join(timeout=5)

    def running(self) -> list[_Plan]:
        return [plan for plan, _child, _reader in self.children.values()]

    def signal(self, signum: int) -> None:
        for _plan, child, _reader in self.children.values():
            with contextlib.suppress(ProcessLookupError):
                os.kill(child.pid, signum)


class Pool(Forked):
    """Each ask in one of ``size`` long-lived workers (forked on demand), which keep their connections;
    while none is idle, it waits as long as they keep answering (``_patience``), then runs in a child."""

    def __init__(self, run: Callable[..., RunResult], size: int) -> None:
        super().__init__(run)
        self.size, self.stopping = size, False
        self.workers: set[multiprocessing.Process] = set()
        self.idle: list[tuple[multiprocessing.Process, object]] = []
        self.waiting: list[tuple[_Plan, datetime, float]] = []  # (plan, due, since): oldest first
        self.answered = 0.0  # when a worker last answered (time.monotonic())
        self.unstarted: list[tuple[_Plan, RunResult]] = []  # asks no process could be started for
        atexit.register(self.retire)

    def start(self, plan: _Plan, *, due: datetime) -> RunResult | None:
        self.waiting.append((plan, due, time.monotonic()))
        self._dispatch()
        if self.unstarted and self.unstarted[-1][0] is plan:
            return self.unstarted.pop()[1]
        return None

    def _dispatch(self) -> None:
        """The waiting asks to idle workers (forked up to ``size``), or out of patience to children."""
        while self.waiting:
            if not self.idle and len(self.workers) < self.size:
                pipe, theirs = self.context.Pipe()
                try:
                    worker = self._fork(_worker, pipe, theirs, name="worker")
                except OSError as exc:
                    plan, due, _since = self.waiting.pop(0)
                    self.unstarted.append((plan, _unstarted(plan, due, exc)))
                    continue
                self.workers.add(worker)
                self.idle.append((worker, pipe))
            if self.idle:
                (plan, due, _since), (worker, pipe) = self.waiting[0], self.idle.pop()
                try:
                    pipe.send((plan.job.name, due))
                except OSError:  # it died while idle (the OOM killer): dropped, the ask waits on
                    self._done(worker, pipe, answered=False)
                    continue
                self.children[pipe.fileno()] = (self.waiting.pop(0)[0], worker, pipe)
            elif self._patience() <= 0:
                plan, due, _since = self.waiting.pop(0)
                if outcome := super().start(plan, due=due):
                    self.unstarted.append((plan, outcome))
            else:
                return

    def collect(self, seconds: float, *, wake: int | None = None) -> list[tuple[_Plan, RunResult]]:
        if self.waiting:  # back by the time the oldest waiting ask may have a child of its own
            seconds = min(seconds, self._patience())
        finished = super().collect(0 if self.unstarted else seconds, wake=wake)
        self._dispatch()
        finished, self.unstarted = self.unstarted + finished, []
        return finished

    def _patience(self) -> float:
        """How much longer the oldest waiting ask waits for a worker."""
        now, since = time.monotonic(), self.waiting[0][2]
        return min(BUSY - (now - max(since, self.answered)), BUSY_MOST - (now - since))

    def running(self) -> list[_Plan]:
        return super().running() + [plan for plan, _due, _since in self.waiting]

    def drop_waiting(self) -> list[tuple[_Plan, RunResult]]:
        """The asks still waiting for a worker, not started (the scheduler stops)."""
        dropped, self.waiting = self.waiting, []
        why = "not started: the scheduler stopped"
        return [(plan, _broke(plan.job.name, due, why)) for plan, due, _since in dropped]

    def _done(self, child: multiprocessing.Process, reader, *, answered: bool) -> None:
        """A worker that answered is idle again until the pool stops; one that did not is dropped."""
        if child in self.workers and answered:
            self.answered = time.monotonic()
            if not self.stopping:
                self.idle.append((child, reader))
                return
        self.workers.discard(child)
        super()._done(child, reader, answered=answered)

    def retire(self) -> None:
        """At exit: each worker exits once it has answered, the idle ones at once."""
        self.stopping = True
        busy = [(child, pipe) for _plan, child, pipe in self.children.values() if child in self.workers]
        for _worker, pipe in [*self.idle, *busy]:
            with contextlib.suppress(OSError):
                pipe.send(None)
        while self.idle:
            self._done(*self.idle.pop(), answered=True)


def _worker(run: Callable[..., RunResult], pipes: tuple) -> None:
    """A pool's worker: an ask for each ``(name, due)`` it receives on ``pipe``, until None or its parent
    is gone; ``pipes``: as ``_child``'s."""
    _ignore_stops()
    pipe, _told, parent = pipes
    with contextlib.suppress(EOFError, OSError):
        while True:
            while not pipe.poll(1):
                if os.getppid() != parent:
                    return
            message = pipe.recv()
            if message is None:
                return
            _reuse_connections()
            _child(run, *message, pipes, keep=True)


def _reuse_connections() -> None:
    """What a request's start does to a persistent connection (``CONN_MAX_AGE`` None), without the age
    limit; also closes one whose idle socket is readable (the server closed it), and empties the query log."""
    for conn in connections.all(initialized_only=True):
        conn.close_at = None
        conn.close_if_unusable_or_obsolete()
        raw = conn.connection  # a socket's (psycopg), not a client that answers any name (pymongo)
        if hasattr(type(raw), "fileno") and select.select([raw], [], [], 0)[0]:
            conn.close()
    reset_queries()


def _ignore_stops() -> None:
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    # After the grace; held back while the run takes or records its lease.
    signal.signal(signal.SIGUSR1, lambda signum, frame: interrupt(SystemExit(0)))


def _child(run: Callable[..., RunResult], name: str, due: datetime, pipes: tuple, keep: bool = False) -> None:
    """Ask for ``name``'s slot ``due``; ``pipes``: to and from the scheduler, and the scheduler's pid."""
    _ignore_stops()
    runner.PARENT[0] = pipes  # the scheduler renews the lease of its run
    writer = pipes[0]
    outcome = _broke(name, due, "its run's process was interrupted")
    try:
        outcome = ask(run, name=name, due=due)
    except SystemExit:
        return  # interrupted after the grace: run_locked recorded the run and released its lease
    finally:
        if not keep:  # a pool's worker keeps its connections for its next ask
            connections.close_all()
        with contextlib.suppress(OSError):
            writer.send(replace(outcome, failure=replace(outcome.failure, exception=None)))


class Scheduler:
    """The loop, its clock, pause check and runs injected for tests. ``workers``: None, each ask in this
    process (``Inline``); 0, in a child of its own (``Forked``); else in a ``Pool`` of that many.
    ``claim``: claim each wake's due ticks first and ask only for those won (locks.models.Tick)."""

    def __init__(
        self,
        jobs: Iterable[Job],
        *,
        now: Callable[[], datetime] = timezone.now,
        run: Callable[..., RunResult] = RUN_SCHEDULED,
        stop: threading.Event | None = None,
        workers: int | None = None,
        paused: Callable[[str], bool] = paused_in_database,
        claim: bool = False,
    ) -> None:
        once = {job.name: job for job in jobs}.values()  # `run_scheduler a a`: one plan, one claim a wake
        self.plans = [_Plan(job, index) for index, job in enumerate(once)]
        # (when to look at a plan, its index), a heap: an entry whose time is not its plan's look_at is stale.
        self.queue = [(EARLIEST, index) for index in range(len(self.plans))]
        self.seen: datetime | None = None  # the clock at the last wake
        self.paused = paused
        self.host_now = now
        # The database clock minus this host's, learned from a slot refused as ahead of it.
        self.skew = timedelta(0)
        self.executor = Inline(run) if workers is None else Pool(run, workers) if workers else Forked(run)
        self.stop = stop or threading.Event()
        self.grace = settings.LOCKS_SCHEDULER_GRACE
        self.claim, self.holder = claim, make_holder()
        self.wake_reader, self.wake_writer = os.pipe()  # a signal's handler wakes the loop through it
        os.set_blocking(self.wake_reader, False)
        os.set_blocking(self.wake_writer, False)

    def now(self) -> datetime:
        return self.host_now() + self.skew

    def running(self) -> list[str]:
        return [plan.job.name for plan in self.executor.running()]

    def wake(self) -> None:
        with contextlib.suppress(BlockingIOError):
            os.write(self.wake_writer, b"!")

    def step(self) -> None:
        """One wake: ask for every job whose current slot was not asked for yet, and for
        every job whose time to ask again has come; never for a job still running."""
        asking = []
        for plan in self._due(self.now()):
            if self.stop.is_set():
                self._queue(plan)  # looked at on the next wake
            elif self._look(plan, self.now()):
                asking.append(plan)
        # Asks run here (``Inline``) end at once: their claims are closed together, as a collect's.
        self._settle_all([(plan, ended) for plan in self._claimed(asking) if (ended := self._ask(plan))])

    def _claimed(self, plans: list[_Plan]) -> list[_Plan]:
        """The plans whose due tick this copy claimed (all, without ``claim`` or when it fails); each
        other one is looked at again once the winner's claim may have ended, or its retry be due."""
        if not self.claim or not plans:
            return plans
        _reuse_connections()  # this process's connection is kept from wake to wake
        try:
            won = Tick.objects.claim(
                [(plan.job.name, plan.tick, plan.job.ttl) for plan in plans], holder=self.holder
            )
        except DBError as exc:
            connections.close_all()
            # INFO: each ask says why it cannot run (an unreachable database is its WARNING).
            logger.info("scheduler: the due ticks were not claimed (%s); each is asked for", error_text(exc))
            return plans
        now = self.now()
        for plan in plans:
            plan.claimed = plan.job.name in won
            if not plan.claimed:  # INFO once a tick: a loser looks again until the slot is over
                level, plan.refused = logging.DEBUG if plan.refused == plan.tick else logging.INFO, plan.tick
                logger.log(level, CLAIMED_ELSEWHERE, plan.job.name, plan.tick.isoformat(), self.holder)
                wait = min((plan.job.ttl, *plan.job.retry_delays[:1]))  # a crontab pass asks once only
                plan.again_at = self._within_chance(plan, now + wait + timedelta(seconds=1))
                self._queue(plan, now)
        return [plan for plan in plans if plan.claimed]

    def _due(self, now: datetime) -> list[_Plan]:
        """The plans whose time to look has come, in the jobs' order; every plan if the clock went back."""
        back, self.seen = self.seen is not None and now < self.seen, now
        if back:
            self.queue.clear()
            return list(self.plans)
        due = set()
        while self.queue and self.queue[0][0] <= now:
            when, index = heapq.heappop(self.queue)
            if self.plans[index].look_at == when:
                due.add(index)
        return [self.plans[index] for index in sorted(due)]

    def _look(self, plan: _Plan, now: datetime) -> bool:
        """Whether to ask for ``plan``'s job now; if not, it is queued again."""
        if not plan.running:
            try:
                tick = plan.job.cron.slot_at_or_before(now)
            except SLOT_ERRORS as exc:  # logged once; looked at again only once the clock goes back
                if plan.look_at is not None:
                    logger.error(NO_SLOT, plan.job.name, plan.job.cron.expression, type(exc).__name__, exc)
                plan.look_at = None
                return False
            if tick != plan.tick:
                plan.tick, plan.again_at, plan.backoff = tick, None, timedelta(0)
                return True
            if plan.again_at is not None and plan.again_at <= now:
                if not (plan.paused and self.paused(plan.job.name)):
                    return True
                plan.again_at = self._within_chance(plan, now + PAUSED_POLL)
        self._queue(plan, now)
        return False

    def _queue(self, plan: _Plan, now: datetime | None = None) -> None:
        """Look at ``plan`` again when its slot is over (while it runs: at its next slot after
        ``now``), or at its time to ask again if that comes first; without ``now``, at the next wake."""
        plan.look_at = EARLIEST if now is None else self._wake_of(plan, now if plan.running else plan.tick)
        heapq.heappush(self.queue, (plan.look_at, plan.index))

    def _wake_of(self, plan: _Plan, after: datetime) -> datetime:
        when = plan.job.cron.next_slot(after)
        return min(when, plan.again_at) if plan.again_at is not None and not plan.running else when

    def next_wake(self) -> datetime:
        """The earliest slot or ask again of any job, and no later than MAX_SLEEP from now."""
        now = self.now()
        if self.seen is not None and now < self.seen:  # the clock went back: each job's next slot
            wakes = [self._wake_of(plan, now) for plan in self.plans if plan.look_at is not None]
            return min([now + MAX_SLEEP, *wakes])
        while self.queue and self.plans[self.queue[0][1]].look_at != self.queue[0][0]:
            heapq.heappop(self.queue)  # stale
        return min(now + MAX_SLEEP, self.queue[0][0]) if self.queue else now + MAX_SLEEP

    def run_forever(
        self, *, wait: Callable[[float], object] | None = None, iterations: int | None = None
    ) -> None:
        """Loop until ``stop`` is set or after ``iterations`` wakes, then give the runs going their grace.
        ``wait``: a test's clock (default: the runs' ends)."""
        done = 0
        while not self.stop.is_set() and (iterations is None or done < iterations):
            self.step()
            if not self.executor.running():  # a broker that stalls the sweep stalls no run's heartbeat
                sweep(plan.job for plan in self.plans)  # the outbox rows a crash left (locks.tasks)
            delay = (self.next_wake() - self.now()).total_seconds()
            if wait is not None and delay > 0 and not self.stop.is_set():
                wait(delay)
            self._settle_all(self.executor.collect(delay if wait is None else 0, wake=self.wake_reader))
            done += 1
        self._finish()

    def _ask(self, plan: _Plan) -> RunResult | None:
        _reuse_connections()
        plan.running = True
        outcome = self.executor.start(plan, due=plan.tick)
        if outcome is None:
            self._queue(plan, self.now())
        return outcome

    def _settle_all(self, finished: list[tuple[_Plan, RunResult]]) -> None:
        """Each ended ask's plan, then the claims of those this copy claimed, in one statement."""
        ends = [end for plan, outcome in finished if (end := self._settle(plan, outcome))]
        if not ends:
            return
        _reuse_connections()  # not one the server closed while the runs went on
        try:
            Tick.objects.close(ends, holder=self.holder)
        except DBError as exc:  # each claim ends at its own time
            logger.warning(
                "scheduler: the claims of %d ticks were not closed (%s)", len(ends), error_text(exc)
            )

    def _settle(self, plan: _Plan, outcome: RunResult) -> tuple | None:
        plan.running = False
        plan.paused = outcome.skip is not None and outcome.skip.reason == "paused"
        if outcome.skip is not None and outcome.skip.reason == "tick_ahead":  # before the time to ask again
            self.skew = min(timedelta(0), self.skew + outcome.skip.db_now - self.now())
        delay = self._delay(plan, outcome)  # when to ask again, never past the chance of the slot asked for
        plan.again_at = None if delay is None else self._within_chance(plan, self.now() + delay)
        self._queue(plan, self.now())
        if plan.again_at is not None:
            again = plan.again_at.isoformat(timespec="seconds")
            logger.info(ASKING_AGAIN, plan.job.name, plan.tick.isoformat(), outcome.outcome.recorded, again)
        return self._end(plan, outcome) if plan.claimed else None

    def _end(self, plan: _Plan, outcome: RunResult) -> tuple:
        """How its tick's claim ends: ``(job, tick, status, again)``; for good (not ``again``) when no
        copy need ask for the tick again."""
        plan.claimed = False
        skip, recorded = outcome.skip, outcome.outcome.recorded
        final = (
            skip.reason in SETTLED and not skip.later if skip is not None else recorded == Outcome.SUCCEEDED
        )
        final = final or (recorded in RETRIED and plan.again_at is None)
        # Under catch_up "all" the run may have been of an earlier slot, with this one still to come.
        final = final and outcome.tick == plan.tick and not outcome.next_due_now
        status = skip.reason if skip is not None else recorded
        if skip is not None and skip.reason == "tick_claimed" and skip.claimed_tick == skip.tick:
            status = Outcome.SUCCEEDED  # done by a run that outlived its claim: say what happened to it
        return plan.job.name, plan.tick, status, not final

    def _within_chance(self, plan: _Plan, again: datetime) -> datetime | None:
        """``again`` if it is before the chance of the slot asked for ends, else None."""
        return again if again < plan.job.chance_end(plan.tick) else None

    def _delay(self, plan: _Plan, result: RunResult) -> timedelta | None:
        skip = result.skip
        if result.outcome == Outcome.REFUSED:
            return None
        # A write in progress holds the lock row, or the database could not be asked: a backoff.
        locked = skip is not None and skip.reason == "held" and skip.locked
        if locked or result.outcome in {Outcome.BROKE, Outcome.UNREACHABLE}:
            plan.backoff = min(max(plan.backoff * 2, BACKOFF_FIRST), BACKOFF_MOST)
            return plan.backoff
        plan.backoff = timedelta(0)
        if result.next_due_now:
            return timedelta(0)  # catch_up "all": that slot is settled, the next one is due
        if result.outcome.recorded in RETRIED:
            return result.grant.retry_delay  # None: the tick had its last attempt
        if skip is None:
            return None  # succeeded
        if skip.reason == "held" and skip.wait is not None:  # once its lease expires (its holder died), or
            # after the first retry delay if sooner: a Run now that holds it may end well before its TTL
            return min((skip.wait, *plan.job.retry_delays[:1])) + timedelta(seconds=1)
        if skip.reason == "retry_later":
            return skip.wait  # another copy's attempt failed: the next one, when it may start
        if skip.reason == "tick_ahead":  # this host's clock is fast: ask once the database's reaches the slot
            return skip.tick - skip.db_now + timedelta(seconds=1)
        if skip.reason == "paused":
            return PAUSED_POLL  # its lock row is read until a resume, then it is asked at once
        if skip.later:  # looked at within the slot's chance, in case an operator's reset gives it back
            return min((plan.job.ttl, *plan.job.retry_delays[:1]))
        return None  # done elsewhere, a later tick claimed, or no attempt left

    def _finish(self) -> None:
        """The runs still going get ``grace`` seconds, then SIGUSR1, then SIGKILL after ``INTERRUPTED_WAIT``."""
        executor = self.executor
        if not isinstance(executor, Forked):
            return
        if isinstance(executor, Pool):  # no run starts once the loop has stopped
            self._settle_all(executor.drop_waiting())
        for seconds, then in ((self.grace, signal.SIGUSR1), (INTERRUPTED_WAIT, signal.SIGKILL)):
            deadline = time.monotonic() + seconds
            while executor.running() and time.monotonic() < deadline:
                self._settle_all(executor.collect(deadline - time.monotonic()))
            if not executor.running():
                return
            logger.warning(
                "scheduler: job=%s still running after %.0f s; %s",
                ", ".join(self.running()),
                seconds,
                "interrupting it" if then == signal.SIGUSR1 else "killing it",
            )
            executor.signal(then)
        self._settle_all(executor.collect(5))


def install_signal_handlers(scheduler: Scheduler) -> None:
    """SIGTERM and SIGINT stop the waiting at once; the runs still going get their grace."""

    def stop(signum, frame) -> None:
        if scheduler.stop.is_set():
            return
        scheduler.stop.set()
        scheduler.wake()
        if running := scheduler.running():
            logger.warning(
                "scheduler: %s received; job=%s may finish within %.0f s",
                signal.Signals(signum).name,
                ", ".join(running),
                scheduler.grace,
            )

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGINT, stop)
