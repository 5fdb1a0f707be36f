"""The tick ledger: each of a job's last ``LOCKS_LEDGER_SLOTS`` slots with exactly one outcome,
computed from the schedule, the run history and the pause history on the database clock, with
no write per tick (docs/architecture.md, "The tick ledger"). The one read that ``locks ticks``,
the admin's strip, ``/metrics`` and ``check_jobs`` share: four queries whatever the number of
jobs, slots or runs.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

from django.conf import settings
from django.db.models import Q

from locks.models import JobPause, JobRun, RunStatus, SyncLock, database_now
from locks.registry import Job
from locks.schedule import next_tick, previous_slots

SUCCEEDED, RUNNING, FAILED, MISSED, PAUSED, PENDING = (
    "succeeded",
    "running",
    "failed",
    "missed",
    "paused",
    "pending",
)
OUTCOMES = (SUCCEEDED, RUNNING, FAILED, MISSED, PAUSED, PENDING)
SETTLED = (SUCCEEDED, FAILED, MISSED, PAUSED)  # outcomes that no longer change
RUN_FIELDS = ("job_name", "tick", "token", "status", "holder", "started_at", "finished_at", "error")


@dataclass(frozen=True)
class Slot:
    tick: datetime
    outcome: str
    runs: tuple[dict, ...] = ()  # the JobRuns of this tick, oldest first (RUN_FIELDS + requested_by)

    @property
    def attempts(self) -> int:
        return len(self.runs)

    def describe(self) -> str:
        """ "2026-12-02 09:00 UTC failed (2 attempts)": a cell's title, a line of an email."""
        text = f"{self.tick:%Y-%m-%d %H:%M} UTC {self.outcome}"
        if self.outcome == FAILED:
            text += f" ({self.attempts} attempt{'s' if self.attempts != 1 else ''})"
        return text

    def as_json(self) -> dict:
        runs = [
            {key: value.isoformat() if isinstance(value, datetime) else value for key, value in run.items()}
            for run in self.runs
        ]
        return {
            "tick": self.tick.isoformat(),
            "outcome": self.outcome,
            "attempts": self.attempts,
            "runs": runs,
        }


@dataclass(frozen=True)
class Ledger:
    job: str
    db_now: datetime
    slots: list[Slot]  # newest first
    paused: bool = False
    counts: Counter = field(default_factory=Counter)

    def settled(self, *, since: datetime | None = None) -> list[Slot]:
        """The slots whose outcome can no longer change (not pending, not running), newest
        first; with ``since``, only those at or after it."""
        return [
            slot for slot in self.slots if slot.outcome in SETTLED and (since is None or slot.tick >= since)
        ]

    def failed_in_a_row(self, *, since: datetime | None = None) -> list[Slot]:
        """The failed slots in a row, counted back from the newest settled one."""
        streak = []
        for slot in self.settled(since=since):
            if slot.outcome != FAILED:
                break
            streak.append(slot)
        return streak


def ledger_slots() -> int:
    return settings.LOCKS_LEDGER_SLOTS


def job_ledgers(*, jobs: Iterable[Job], slots: int | None = None) -> dict[str, Ledger]:
    """Each job's ledger of its last ``slots`` slots (default ``LOCKS_LEDGER_SLOTS``), by name."""
    jobs = list(jobs)
    if not jobs:
        return {}
    count = slots or ledger_slots()
    db_now = database_now()
    windows = {job.name: previous_slots(job.schedule, now=db_now, count=count) for job in jobs}
    names = [job.name for job in jobs]
    oldest = {name: ticks[-1] for name, ticks in windows.items()}
    runs_of = defaultdict(lambda: defaultdict(list))
    in_window = Q()
    for name, since in oldest.items():
        in_window |= Q(job_name=name, tick__gte=since)
    for run in JobRun.objects.filter(in_window).order_by("started_at").values(*RUN_FIELDS, "requested_by"):
        runs_of[run["job_name"]][run["tick"]].append(run)
    locks = {
        row["job_name"]: row
        for row in SyncLock.objects.filter(job_name__in=names).values(
            "job_name", "token", "locked_until", "tick", "paused_at"
        )
    }
    pauses = defaultdict(list)
    for pause in JobPause.objects.filter(
        Q(resumed_at__isnull=True) | Q(resumed_at__gte=min(oldest.values())), job_name__in=names
    ).values_list("job_name", "paused_at", "resumed_at"):
        pauses[pause[0]].append((pause[1], pause[2]))
    return {
        job.name: build_ledger(
            job,
            ticks=windows[job.name],
            runs=runs_of[job.name],
            lock=locks.get(job.name, {}),
            pauses=pauses[job.name],
            db_now=db_now,
        )
        for job in jobs
    }


def build_ledger(
    job: Job, *, ticks: list[datetime], runs: dict, lock: dict, pauses: list, db_now: datetime
) -> Ledger:
    """The ledger of ``job`` over ``ticks`` (newest first), from its runs by tick, its lock row's
    ``token``, ``locked_until``, ``tick`` and ``paused_at``, and its pauses (``(paused_at,
    resumed_at or None)``), judged at ``db_now``: no query (tests inject every part)."""
    slots = [_slot(job, tick, runs.get(tick, []), lock=lock, pauses=pauses, db_now=db_now) for tick in ticks]
    return Ledger(
        job=job.name,
        db_now=db_now,
        slots=slots,
        paused=lock.get("paused_at") is not None,
        counts=Counter(slot.outcome for slot in slots),
    )


def _slot(job: Job, tick: datetime, runs: list[dict], *, lock: dict, pauses: list, db_now: datetime) -> Slot:
    """The one outcome of ``tick`` (the design notes' definitions, docs/architecture.md)."""
    runs = tuple({key: value for key, value in run.items() if key != "job_name"} for run in runs)
    if any(run["status"] == RunStatus.SUCCEEDED for run in runs):
        return Slot(tick, SUCCEEDED, runs)
    in_force = lock.get("locked_until") is not None and lock["locked_until"] >= db_now
    if any(run["status"] == RunStatus.RUNNING and in_force and run["token"] == lock["token"] for run in runs):
        return Slot(tick, RUNNING, runs)
    ends = chance_end(job, tick)
    over = db_now >= ends or len(runs) >= 1 + len(job.retry_delays)
    if job.catch_up == "latest" and lock.get("tick") is not None and lock["tick"] > tick:
        over = True  # superseded: a later slot was claimed (a copy may claim one a little early)
    if not over:
        return Slot(tick, PENDING, runs)
    if runs:
        return Slot(tick, FAILED, runs)
    if _covered(pauses, start=tick, end=min(ends, db_now)):
        return Slot(tick, PAUSED, runs)
    return Slot(tick, MISSED, runs)


def chance_end(job: Job, tick: datetime) -> datetime:
    """When ``tick``'s chance is over (if attempts remain): the next slot under the ``latest``
    catch-up policy, ``catch_up_window`` after the slot under ``all``."""
    if job.catch_up == "all":
        return tick + job.catch_up_window
    return next_tick(job.schedule, now=tick)


def _covered(pauses: list[tuple[datetime, datetime | None]], *, start: datetime, end: datetime) -> bool:
    """Whether the pauses (``(paused_at, resumed_at or None)``) cover all of ``[start, end)``."""
    reached = start
    for paused_at, resumed_at in sorted(pauses, key=lambda pause: pause[0]):
        if paused_at > reached:
            break
        if resumed_at is None:
            return True
        reached = max(reached, resumed_at)
        if reached >= end:
            return True
    return reached >= end
