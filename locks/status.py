"""The read side, on the database clock; nothing here writes: lock states, job health and freshness, the
admin's summary, the tick ledger (each recent slot's one outcome; docs/architecture.md, "The tick ledger")."""

from __future__ import annotations

from collections import Counter, defaultdict, namedtuple
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import reduce
from operator import or_
from typing import Any

from django.apps import apps
from django.conf import settings
from django.core.exceptions import ImproperlyConfigured
from django.db.models import Count, Max, OuterRef, Q, Subquery
from django.db.models.functions import Coalesce, Now
from django.utils import timezone

from locks.conf import MAX_LEDGER_SLOTS
from locks.lease import Pause, iso
from locks.models import PAUSE_FIELDS, STUCK_Q, JobPause, JobRun, Outcome, SyncLock, database_now
from locks.registry import SLOT_ERRORS, Job
from locks.registry import jobs as registered_jobs
from locks.schedule import Schedule, local_label, zone_name

# A registered job without a lock row: it creates its lock on its first run.
NEVER_RUN = "never run"
# The lock row's last_* columns: how its job's last run went.
LastRun = namedtuple("LastRun", "status started_at finished_at error", defaults=("", None, None, ""))
NO_PAUSE = Pause("", None)  # a lock not paused: its paused_* columns empty
LEASE_FIELDS = ("state", "holder", "token", "locked_until", "heartbeat_at", "tick")  # the row's names too


def computed(slots: Callable[..., Any], *args) -> tuple[Any, str]:
    """``(slots(*args), "")``, or ``(None, why)`` when the job's schedule raised ``SLOT_ERRORS``."""
    try:
        return slots(*args), ""
    except SLOT_ERRORS as exc:
        return None, f"its schedule has no slot that can be computed ({type(exc).__name__}: {exc})"


@dataclass(frozen=True)
class LockState:
    job: str
    state: str  # NEVER_RUN: the defaults that follow
    holder: str = ""
    token: int | None = None
    locked_until: datetime | None = None
    heartbeat_at: datetime | None = None
    tick: datetime | None = None
    last_run: LastRun = field(default_factory=LastRun)
    db_now: datetime | None = None
    pause: Pause = NO_PAUSE  # an operator's pause (locks.operator); since None: not paused

    @property
    def paused(self) -> bool:
        return self.pause.since is not None

    def as_json(self) -> dict:  # flat, in the lock row's names (locks status --json, /healthz)
        lease = {name: getattr(self, name) for name in ("job", *LEASE_FIELDS)}
        last_run = {f"last_{key}": value for key, value in self.last_run._asdict().items()}
        pause = {"paused_at": self.pause.since, "paused_by": self.pause.by, "paused_note": self.pause.note}
        return {**_jsonable({**lease, **last_run, "db_now": self.db_now, **pause}), "paused": self.paused}


def _jsonable(values: dict) -> dict:
    return {key: iso(value) if isinstance(value, datetime) else value for key, value in values.items()}


def lock_states() -> list[LockState]:
    """Every lock with its state, in one query."""
    return [_lock_state_of(row) for row in SyncLock.objects.with_state().order_by("job_name")]


def job_states() -> list[LockState]:
    """Every lock, and every job in ``LOCKS_JOBS`` that never ran, by job name; one query."""
    states = {state.job: state for state in lock_states()}
    for name in registered_jobs():
        states.setdefault(name, LockState(name, NEVER_RUN))
    return [states[name] for name in sorted(states)]


def _lock_state_of(row: SyncLock) -> LockState:
    """``row`` must come from ``SyncLock.objects.with_state()`` (its ``state`` and ``db_now``)."""
    last_run = LastRun(*(getattr(row, f"last_{key}") for key in LastRun._fields))
    pause = Pause(*(getattr(row, name) for name in PAUSE_FIELDS))
    lease = (getattr(row, name) for name in LEASE_FIELDS)
    return LockState(row.job_name, *lease, last_run, row.db_now, pause)


@dataclass(frozen=True)
class JobHealth:
    """When ``job`` last succeeded, and its lock, read against the database clock."""

    job: str
    db_now: datetime | None
    last_success_at: datetime | None
    lock: LockState | None
    first_seen: datetime | None = None  # when its lock row was created

    @property
    def paused(self) -> bool:
        return self.lock is not None and self.lock.paused


def jobs_health(*, jobs: Iterable[str]) -> dict[str, JobHealth]:
    """Each job's lock and last success (the newest end of a succeeded run; none without a lock row),
    with the database's now: one query."""
    jobs = list(jobs)
    runs = JobRun.objects.filter(job_name=OuterRef("job_name"), finished_at__isnull=False).succeeded()
    newest = runs.order_by("-finished_at").values("finished_at")[:1]  # an index's first entry
    rows = SyncLock.objects.filter(job_name__in=jobs).with_state().annotate(last_success_at=Subquery(newest))
    locks = {row.job_name: row for row in rows}
    db_now = next(iter(locks.values())).db_now if locks else None
    health = {}
    for job in jobs:
        row = locks.get(job)
        lock = (row.last_success_at, _lock_state_of(row), row.created_at) if row else (None, None, None)
        health[job] = JobHealth(job, db_now, *lock)
    return health


# --- freshness (/healthz) --------------------------------------------------------------


@dataclass(frozen=True)
class Freshness:
    job: JobHealth
    cron: Schedule  # the job's schedule, read in its time zone
    fresh_since: datetime | None  # the oldest success still fresh (None: no slot computable)
    error: str = ""  # why the slots cannot be computed (locks.registry.SLOT_ERRORS)

    @property
    def since(self) -> datetime | None:
        """Its last success, else its lock row's creation (as check_jobs judges a new job); None: stale."""
        return self.job.last_success_at or self.job.first_seen

    @property
    def status(self) -> str:
        """What /healthz says: ``error`` (no slot computable), ``paused`` (not judged), ``ok``, ``stale``."""
        if self.error:
            return "error"
        if self.job.paused:
            return "paused"
        fresh = self.fresh_since is not None and self.since is not None and self.since >= self.fresh_since
        return "ok" if fresh else "stale"

    @property
    def stale_after(self) -> datetime | None:
        """When it stops being fresh: at the second slot after ``since``."""
        if self.since is None or self.error:
            return None
        return self.cron.upcoming(self.since, 2)[1]


def jobs_freshness() -> dict[str, Freshness]:
    """Each job of ``LOCKS_JOBS``: fresh unless two of its slots passed without a success (its last
    success is at or after the slot before its latest, at the database's now); two queries."""
    registered = registered_jobs()
    health = jobs_health(jobs=registered)
    freshness = {}
    for name, job in registered.items():
        now = health[name].db_now or timezone.now()
        previous, error = computed(job.cron.previous, now, 2)
        fresh_since = previous[1] if previous else None  # the slot before the latest
        freshness[name] = Freshness(health[name], job.cron, fresh_since, error)
    return freshness


# --- open incidents: kept by an optional app (locks.contrib.alerts), none without one -----


# reason: what opened it (missed, failed, stale, error or failover); email: the opening email's state (pending,
# claimed, sent, uncertain or no recipient).
OpenIncident = namedtuple("OpenIncident", "job reason summary opened_at email")


def open_incidents(*, jobs: Iterable[str] | None = None) -> dict[str, OpenIncident]:
    """The incidents open now, by job (of ``jobs``, else all), from each AppConfig's ``open_incidents``."""
    sources = [config for config in apps.get_app_configs() if hasattr(config, "open_incidents")]
    return {incident.job: incident for config in sources for incident in config.open_incidents(jobs=jobs)}


# --- the summary above the admin's list of locks ----------------------------------


# next_tick: None when its schedule has no slot that can be computed (error); paused_incident_since: paused
# with an incident open, since when; paused_at, paused_by: an operator's pause (its next tick will not run).
ScheduledJob = namedtuple(
    "ScheduledJob", "job last_success next_tick error paused_incident_since paused_at paused_by"
)
# error: LOCKS_JOBS is invalid, the jobs cannot be listed.
Summary = namedtuple("Summary", "jobs stuck db_now error", defaults=("",))


def lock_summary() -> Summary:
    """Each job's last success and next tick, and the number of stuck locks; three queries."""
    # An aggregate answers with one row even when there are no locks yet.
    locks = SyncLock.objects.aggregate(stuck=Count("pk", filter=STUCK_Q), db_now=Coalesce(Max(Now()), Now()))
    db_now = locks["db_now"]
    try:
        registered = registered_jobs()
    except ImproperlyConfigured as exc:  # the page still shows the locks, and why no jobs
        return Summary(jobs=[], stuck=locks["stuck"], db_now=db_now, error=str(exc))
    health = jobs_health(jobs=registered)
    paused = {name for name, job in health.items() if job.paused}
    incidents = {name: incident.opened_at for name, incident in open_incidents(jobs=paused).items()}
    jobs = []
    for name, job in registered.items():
        upcoming, error = computed(job.cron.next_slot, db_now)
        pause = (lock.pause.since, lock.pause.by) if (lock := health[name].lock) else (None, "")
        jobs.append(
            ScheduledJob(name, health[name].last_success_at, upcoming, error, incidents.get(name), *pause)
        )
    return Summary(jobs=jobs, stuck=locks["stuck"], db_now=db_now)


# A slot's outcomes in the ledger; unknown: its run's COMMIT got no answer, not yet resolved.
OUTCOMES = [Outcome(o) for o in ("succeeded", "running", "failed", "missed", "paused", "pending", "unknown")]
SETTLED = (Outcome.SUCCEEDED, Outcome.FAILED, Outcome.MISSED, Outcome.PAUSED)  # they no longer change
# A slot whose job was paused this long from its tick on had its moment while paused.
SLOT_MOMENT = timedelta(seconds=1)
RUN_FIELDS = (
    *("job_name", "tick", "token", "status", "holder", "started_at", "finished_at", "error"),
    *("timeline", "failover"),  # the database history of each run, and a failover it met (rule 16)
)
LOCK_FIELDS = ("job_name", "token", "locked_until", "tick", "tick_attempts", "paused_at", "created_at")


@dataclass(frozen=True)
class Slot:
    tick: datetime
    outcome: str
    runs: tuple[dict, ...] = ()  # the JobRuns of this tick, oldest first (RUN_FIELDS + requested_by)

    @property
    def attempts(self) -> int:
        return len(self.runs)

    @property
    def failover(self) -> str:
        """What a failover did to this slot (a run lost with the old primary, or run again); "" if none."""
        return next((run["failover"] for run in self.runs if run.get("failover")), "")

    def describe(self, *, tz: str = "UTC") -> str:
        """ "2026-12-02 09:00 UTC failed (2 attempts)": a cell's title, a line of an email; in
        another zone, "2027-03-28 03:00 CEST (01:00 UTC) failed"."""
        utc = f" ({self.tick:%H:%M} UTC)" if zone_name(tz) != "UTC" else ""
        text = f"{local_label(self.tick, tz=tz)}{utc} {self.outcome}"
        if self.outcome == Outcome.FAILED:
            text += f" ({self.attempts} attempt{'s' if self.attempts != 1 else ''})"
        if self.failover:
            text += " (a database failover: it may have run on the old primary too)"
        return text

    def as_json(self) -> dict:
        fields = {"tick": self.tick.isoformat(), "outcome": self.outcome, "attempts": self.attempts}
        return {**fields, "failover": self.failover, "runs": [_jsonable(run) for run in self.runs]}


@dataclass(frozen=True)
class Ledger:
    job: str
    db_now: datetime
    slots: list[Slot]  # newest first
    paused: bool = False
    counts: Counter = field(default_factory=Counter)
    error: str = ""  # its schedule's slots cannot be computed: no slots (locks.registry.SLOT_ERRORS)
    timezone: str = "UTC"  # the job's: where its slots are shown

    def settled(self, *, since: datetime | None = None) -> list[Slot]:
        """The slots whose outcome can no longer change, newest first; with ``since``, from it on."""
        return [
            slot for slot in self.slots if slot.outcome in SETTLED and (since is None or slot.tick >= since)
        ]


def job_ledgers(*, jobs: Iterable[Job], slots: int | None = None) -> dict[str, Ledger]:
    """Each job's ledger of its last ``slots`` slots (default ``LOCKS_LEDGER_SLOTS``), by name."""
    jobs = list(jobs)
    if not jobs:
        return {}
    count = min(slots or settings.LOCKS_LEDGER_SLOTS, MAX_LEDGER_SLOTS)
    db_now = database_now()
    windows = {job.name: computed(job.cron.previous, db_now, count) for job in jobs}
    names = [job.name for job in jobs]
    oldest = {name: ticks[-1] for name, (ticks, _error) in windows.items() if ticks}
    runs_of = defaultdict(lambda: defaultdict(list))
    in_window = reduce(or_, (Q(job_name=name, tick__gte=since) for name, since in oldest.items()), Q())
    runs = JobRun.objects.filter(in_window) if oldest else JobRun.objects.none()  # no slot: no run read
    for run in runs.order_by("tick", "started_at").values(*RUN_FIELDS, "requested_by"):  # the index's order
        runs_of[run["job_name"]][run["tick"]].append(run)
    locks = {row["job_name"]: row for row in SyncLock.objects.filter(job_name__in=names).values(*LOCK_FIELDS)}
    pauses, start = defaultdict(list), min(oldest.values(), default=db_now)
    rows = JobPause.objects.filter(Q(resumed_at__isnull=True) | Q(resumed_at__gte=start), job_name__in=names)
    for name, paused_at, resumed_at in rows.values_list("job_name", "paused_at", "resumed_at"):
        pauses[name].append((paused_at, resumed_at))
    ledgers = {}
    for job in jobs:
        # A job starts with its lock row (its first run, or check_jobs first seeing it): no slot before.
        (ticks, error), lock = windows[job.name], locks.get(job.name, {"created_at": db_now})
        ledger = build_ledger(
            job, ticks=ticks or [], runs=runs_of[job.name], lock=lock, pauses=pauses[job.name], db_now=db_now
        )
        ledgers[job.name] = replace(ledger, error=error)
    return ledgers


def build_ledger(
    job: Job, *, ticks: list[datetime], runs: dict, lock: dict, pauses: list, db_now: datetime
) -> Ledger:
    """The ledger of ``job`` over ``ticks`` (newest first) from its runs by tick, its lock row (no
    slot before its ``created_at`` without runs) and its pauses, judged at ``db_now``; no query."""
    if lock.get("created_at") is not None and ticks:
        first = job.cron.slot_at_or_before(lock["created_at"])
        ticks = [tick for tick in ticks if tick >= first or tick in runs]
    slots = [_slot(job, tick, runs.get(tick, []), lock=lock, pauses=pauses, db_now=db_now) for tick in ticks]
    return Ledger(
        job=job.name,
        db_now=db_now,
        slots=slots,
        paused=lock.get("paused_at") is not None,
        counts=Counter(slot.outcome for slot in slots),
        timezone=job.cron.timezone,
    )


def _slot(job: Job, tick: datetime, runs: list[dict], *, lock: dict, pauses: list, db_now: datetime) -> Slot:
    """The one outcome of ``tick`` (the design notes' definitions, docs/architecture.md)."""
    runs = tuple({key: value for key, value in run.items() if key != "job_name"} for run in runs)
    if any(run["status"] == Outcome.SUCCEEDED for run in runs):
        return Slot(tick, Outcome.SUCCEEDED, runs)
    in_force = lock.get("locked_until") is not None and lock["locked_until"] >= db_now
    if any(run["status"] == Outcome.RUNNING and in_force and run["token"] == lock["token"] for run in runs):
        return Slot(tick, Outcome.RUNNING, runs)
    if any(run["status"] == Outcome.UNKNOWN for run in runs):
        return Slot(tick, Outcome.UNKNOWN, runs)
    ends = job.chance_end(tick)
    # Its attempts used: the lease row's count for its tick (a run stopped before its body gave one back)
    used = lock.get("tick_attempts") if lock.get("tick") == tick else None
    over = db_now >= ends or (len(runs) if used is None else used) >= job.max_attempts
    if job.catch_up.policy == "latest" and lock.get("tick") is not None and lock["tick"] > tick:
        over = True  # superseded: a later slot was claimed (a copy may claim one a little early)
    if not over:
        return Slot(tick, Outcome.PENDING, runs)
    if runs:
        return Slot(tick, Outcome.FAILED, runs)
    # Paused when its time came (a resume too late to ask again, or cron that never does), or
    # for all of its chance: lost to the pause, not missed.
    paused = any(_covered(pauses, start=tick, end=end) for end in (tick + SLOT_MOMENT, min(ends, db_now)))
    return Slot(tick, Outcome.PAUSED if paused else Outcome.MISSED, runs)


def _covered(pauses: list[tuple[datetime, datetime | None]], *, start: datetime, end: datetime) -> bool:
    """Whether the pauses (``(paused_at, resumed_at or None)``) cover all of ``[start, end)``."""
    reached = start
    for paused_at, resumed_at in sorted(pauses, key=lambda pause: pause[0]):
        if paused_at > reached:
            break
        if resumed_at is None:
            return True
        reached = max(reached, resumed_at)
    return reached >= end
