"""The soak's checker: after the replicas stopped, what the database and their logs say, slot by slot.

Every slot of the soak window must have exactly one committed ``SlotWrite`` row, written under
the token of the lease that held the slot when it committed: the ``JobRun`` of that token and
tick is ``succeeded``, and no row comes from a token whose run ended ``failed``,
``lost_lock``, ``abandoned`` or ``released``. Each slot that ran has exactly one
``succeeded`` run; no run is left ``running``; no replica printed a traceback; every
SIGTERM stopped its replica (exit 0, within its bound).

Two more come from issue 17's "bounded waits": a fenced write must commit while its lease is
in force (the proxies time each one from its renewal to the server's answer to its COMMIT:
more than the TTL is a stale write, although its run may say ``succeeded``), and no contender
waits on the lock row longer than the TTL to learn that it must skip (the replicas' log lines).
And every fenced write the server acknowledged must still be there: otherwise the database
lost data (a server crash with commits not yet written) and no other verdict means much.

A lost slot (no row) is reported apart from the rest. Under the ``latest`` catch-up policy
(the default) a slot that had no chance at all (no replica alive and no database for
``MIN_CHANCE`` seconds of its period) may be missed by design: such a slot is counted as
lost but *excused*, and does not fail the check; under ``catch_up: "all"`` nothing is.

The judging is pure (``judge`` takes plain records), so it is tested on made-up histories
(tests/soak/test_checker.py); ``load`` reads the records from the soak's database.

The reminders part (``--reminders``) adds its own ``Check`` rows (``REMINDER_CHECKS``), judged
by ``tests.soak.reminders`` from the ``Reminder`` rows and the SMTP stand-in's messages.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from tests.soak.timing import JOB, MIN_CHANCE, PERIOD, TTL

HEALTHY = "none (healthy)"
SUCCEEDED, RUNNING = "succeeded", "running"
EXAMPLES = 6  # slots named in a check's detail
# The proxy's clock reads a fenced write's renewal as it passes and the COMMIT's answer as it
# comes back, both a little later than the server's: this much over the TTL is not counted.
COMMIT_TOLERANCE = 0.25

CHECKS = {
    "one-write-per-slot": "no slot has two committed rows (duplicates)",
    "no-lost-slot": "every slot of the window has its committed row (lost slots)",
    "writes-under-their-lease": "every row was written under a lease whose run of that slot succeeded (stale writes)",
    "one-success-per-slot": "every slot that ran has exactly one succeeded run, the one that wrote its row",
    "no-run-left-running": "no JobRun is left running",
    "no-traceback": "no traceback in any replica's stderr",
    "bounded-waits": f"no contender waited more than the TTL ({TTL} s) on the lock row to learn it must skip",
    "acknowledged-commits-kept": "every fenced write the server acknowledged (as its proxy saw) has its row",
    "replicas-stop-on-sigterm": "every SIGTERM stopped its replica, exit 0, within its bound; none exited unasked",
}
REMINDER_CHECKS = {
    "reminder-once": "no reminder emailed twice, but for the documented re-sends after a SIGKILL of its run",
    "uncertain-not-resent": "a lost SMTP reply leaves its reminder uncertain, and it is never re-sent by itself",
    "reminders-delivered": "every reminder due by the last slot is delivered, uncertain or failed; none left pending",
}

# The failover nemesis (--failover; tests.soak.failover judges them).
FAILOVER_CHECKS = {
    "failovers-done": "at least one failover per 120 s, each one promoted, switched and given a fresh standby",
    "no-slot-twice": "no slot has two acknowledged fenced writes, in one database history or across a failover (none run twice)",
    "repeats-named": "every slot with two acknowledged fenced writes had them in two histories and is named by that failover's WARNING and the ledger (none silent)",
    "lost-writes-only-unreplicated": "every acknowledged fenced write the surviving database lacks was acknowledged while its failover's link was frozen",
    "succeeded-with-its-write": "every succeeded run and the lock row's done tick have their fenced write in the surviving database",
    "reminders-paused-on-failover": "every failover paused send_reminders (locks:failover, the note naming it) and the soak resumed it",
    "emails-across-failovers": "sync: no email sent again across a failover; async: each one after that failover's pause named it",
}


@dataclass(frozen=True)
class Write:
    tick: datetime | None
    token: int
    holder: str


@dataclass(frozen=True)
class Run:
    tick: datetime | None
    token: int
    holder: str
    status: str
    started_at: datetime
    error: str = ""


@dataclass(frozen=True)
class FencedCommit:
    """A fenced write the server committed, as a proxy saw it."""

    token: int
    seconds: float  # from its renewal to the server's answer to its COMMIT


@dataclass(frozen=True)
class Check:
    name: str
    passed: bool
    detail: str

    def as_json(self) -> dict:
        title = CHECKS.get(self.name) or REMINDER_CHECKS.get(self.name) or FAILOVER_CHECKS[self.name]
        return {"name": self.name, "title": title, "passed": self.passed, "detail": self.detail}


@dataclass
class Verdict:
    checks: list[Check]
    slots: list[dict]  # one per slot seen or expected: counts and what went wrong
    table: list[dict]  # one row per nemesis kind, then the healthy slots, then all
    stale: list[dict] = field(default_factory=list)
    running: list[dict] = field(default_factory=list)
    waits: list[dict] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return all(check.passed for check in self.checks)

    def check(self, name: str) -> Check:
        return next(check for check in self.checks if check.name == name)


def judge(
    *,
    window: list[datetime],
    writes: list[Write],
    runs: list[Run],
    commits: list[FencedCommit],
    skips: list[dict],
    kinds: tuple[str, ...],
    kind_of: Callable[[datetime | None], str],
    chance: Callable[[datetime], float],
    catch_up: str,
    tracebacks: list[str],
    stops: list[dict],
    label: Callable[[datetime | None], str],
) -> Verdict:
    """Every check over one soak's records.

    ``window``: the slots that must have run. ``kind_of(tick)``: the nemesis kind a slot is
    charged to (``HEALTHY`` if none). ``chance(tick)``: seconds of that slot's period with the
    database up and a replica able to run it. ``skips``: every skip the lock row decided, as
    logged (``{"replica", "tick", "reason", "seconds"}``). ``stops``: every SIGTERM's ``{"replica", "code",
    "seconds"}`` (code None: it did not stop). ``label(tick)``: how a slot is named in details.
    """
    writes_of: dict[datetime | None, list[Write]] = defaultdict(list)
    for write in writes:
        writes_of[write.tick].append(write)
    succeeded_of: dict[datetime | None, list[Run]] = defaultdict(list)
    for run in runs:
        if run.status == SUCCEEDED:
            succeeded_of[run.tick].append(run)
    in_window = set(window)
    ticks = sorted(in_window | {tick for tick in [*writes_of, *succeeded_of] if tick is not None})

    slots = []
    for tick in ticks:
        written, succeeded = writes_of[tick], succeeded_of[tick]
        lost = tick in in_window and not written
        first_success = min((run.started_at for run in succeeded), default=None)
        slots.append(
            {
                "slot": tick.isoformat(),
                "label": label(tick),
                "kind": kind_of(tick),
                "in_window": tick in in_window,
                "tokens_written": sorted(write.token for write in written),
                "tokens_succeeded": sorted(run.token for run in succeeded),
                "duplicate": len(written) > 1,
                "lost": lost,
                "excused": lost and catch_up != "all" and chance(tick) < MIN_CHANCE,
                "chance": round(chance(tick), 1) if lost else None,
                "success_mismatch": bool(written or succeeded)
                and (
                    {run.token for run in succeeded} != {write.token for write in written}
                    or len(succeeded) != 1
                ),
                "late": first_success is not None and first_success - tick > timedelta(seconds=PERIOD),
            }
        )

    run_of = {run.token: run for run in runs}
    held_for = {commit.token: commit.seconds for commit in commits}
    stale = []
    for write in writes:
        run = run_of.get(write.token)
        seconds = held_for.get(write.token)
        if run is None:
            why = f"no JobRun has token {write.token}"
        elif run.status != SUCCEEDED:
            why = f"its run (token {write.token}) ended {run.status}: {run.error[:160]}"
        elif run.tick != write.tick:
            why = f"its run (token {write.token}) was for {label(run.tick)}"
        elif seconds is not None and seconds > TTL + COMMIT_TOLERANCE:
            why = (
                f"its fenced write (token {write.token}) committed {seconds:.1f} s after its renewal, "
                f"past its {TTL} s lease (its run says {run.status})"
            )
        else:
            continue
        stale.append(
            {"slot": label(write.tick), "kind": kind_of(write.tick), "token": write.token, "why": why}
        )
    running = [
        {"slot": label(run.tick), "kind": kind_of(run.tick), "token": run.token, "holder": run.holder}
        for run in runs
        if run.status == RUNNING
    ]
    waits = [
        {**skip, "slot": label(skip["tick"]), "kind": kind_of(skip["tick"]), "tick": skip["tick"].isoformat()}
        for skip in skips
        if skip["seconds"] > TTL
    ]
    written_tokens = {write.token for write in writes}
    unseen = len(written_tokens - set(held_for))
    forgotten = sorted(set(held_for) - written_tokens)

    checks = [
        _slot_check(
            "one-write-per-slot",
            [slot for slot in slots if slot["duplicate"]],
            lambda slot: f"{slot['label']} tokens {slot['tokens_written']}",
            "written twice",
        ),
        _lost_check(slots, catch_up=catch_up),
        Check(
            "writes-under-their-lease",
            not stale,
            listed(plural(len(stale), "stale row"), [f"{row['slot']}: {row['why']}" for row in stale])
            if stale
            else f"all {len(writes)} rows written under a lease whose run of that slot succeeded, "
            f"{len(writes) - unseen} of them seen committing within their lease"
            + (f" ({unseen} commits no proxy saw: the server stopped as it answered)" if unseen else ""),
        ),
        _slot_check(
            "one-success-per-slot",
            [slot for slot in slots if slot["success_mismatch"]],
            lambda slot: (
                f"{slot['label']} rows by tokens {slot['tokens_written']}, "
                f"succeeded runs {slot['tokens_succeeded']}"
            ),
            "whose succeeded runs are not exactly the one that wrote its row",
        ),
        Check(
            "no-run-left-running",
            not running,
            listed(
                f"{plural(len(running), 'run')} left running",
                [f"{row['slot']} token {row['token']}" for row in running],
            )
            if running
            else f"none of {len(runs)} runs",
        ),
        Check(
            "no-traceback",
            not tracebacks,
            listed(plural(len(tracebacks), "traceback"), tracebacks) if tracebacks else "none",
        ),
        Check(
            "bounded-waits",
            not waits,
            listed(
                f"{len(waits)} of {len(skips)} skips came after more than {TTL} s",
                [
                    f"{wait['replica']} {wait['slot']} after {wait['seconds']:.1f} s ({wait['reason']})"
                    for wait in waits
                ],
            )
            if waits
            else f"all {len(skips)} skips within {TTL} s (longest {max((s['seconds'] for s in skips), default=0):.1f} s)",
        ),
        Check(
            "acknowledged-commits-kept",
            not forgotten,
            listed(
                f"the server acknowledged {plural(len(forgotten), 'fenced write')} it no longer has",
                [f"token {token}" for token in forgotten],
            )
            if forgotten
            else f"all {len(held_for)} acknowledged fenced writes have their rows",
        ),
        _stop_check(stops),
    ]
    return Verdict(
        checks=checks,
        slots=slots,
        table=_table(slots, stale, running, waits, kinds),
        stale=stale,
        running=running,
        waits=waits,
    )


def plural(count: int, noun: str) -> str:
    return f"{count} {noun}" if count == 1 else f"{count} {noun}s"


def listed(head: str, items: list[str]) -> str:
    more = f", and {len(items) - EXAMPLES} more" if len(items) > EXAMPLES else ""
    return f"{head}: {'; '.join(items[:EXAMPLES])}{more}"


def _slot_check(name: str, bad: list[dict], show: Callable[[dict], str], what: str) -> Check:
    if not bad:
        return Check(name, True, "none")
    return Check(name, False, listed(f"{plural(len(bad), 'slot')} {what}", [show(slot) for slot in bad]))


def _lost_check(slots: list[dict], *, catch_up: str) -> Check:
    lost = [slot for slot in slots if slot["lost"]]
    failing = [slot for slot in lost if not slot["excused"]]
    excused = len(lost) - len(failing)
    policy = f"catch_up {catch_up!r}" if catch_up else "catch_up not set: the default, latest"
    note = (
        f"; {excused} more excused (no replica and database for {MIN_CHANCE:g} s of the period)"
        if excused
        else ""
    )
    if not failing:
        return Check(
            "no-lost-slot", True, f"none of {sum(slot['in_window'] for slot in slots)} slots{note}; {policy}"
        )
    return Check(
        "no-lost-slot",
        False,
        listed(
            f"{plural(len(failing), 'slot')} lost with a chance to run ({policy})",
            [f"{slot['label']} ({slot['kind']}, {slot['chance']:g} s of chance)" for slot in failing],
        )
        + note,
    )


def _stop_check(stops: list[dict]) -> Check:
    asked = [stop for stop in stops if stop["asked"]]
    bad = [stop for stop in stops if stop["code"] != 0 or not stop["asked"]]
    if not bad:
        return Check("replicas-stop-on-sigterm", True, f"all {len(asked)} SIGTERMs: exit 0")

    def show(stop: dict) -> str:
        if not stop["asked"]:
            return f"{stop['replica']} exited by itself (exit {stop['code']}), noticed at +{stop['at']:.0f} s"
        if stop["code"] is None:
            return f"{stop['replica']} at +{stop['at']:.0f} s: still running after {stop['seconds']:.0f} s"
        return f"{stop['replica']} at +{stop['at']:.0f} s: exit {stop['code']}"

    return Check(
        "replicas-stop-on-sigterm",
        False,
        listed(f"{len(bad)} of {len(stops)} stops", [show(stop) for stop in bad]),
    )


def _table(
    slots: list[dict], stale: list[dict], running: list[dict], waits: list[dict], kinds: tuple[str, ...]
) -> list[dict]:
    rows = []
    for kind in [*kinds, HEALTHY, "all"]:
        mine = [slot for slot in slots if slot["in_window"] and kind in {slot["kind"], "all"}]
        rows.append(
            {
                "kind": kind,
                "slots": len(mine),
                "duplicates": sum(slot["duplicate"] for slot in mine),
                "lost": sum(slot["lost"] and not slot["excused"] for slot in mine),
                "excused": sum(slot["excused"] for slot in mine),
                "stale": sum(kind in {row["kind"], "all"} for row in stale),
                "running": sum(kind in {row["kind"], "all"} for row in running),
                "waits": sum(kind in {row["kind"], "all"} for row in waits),
                "success_mismatch": sum(slot["success_mismatch"] for slot in mine),
                "late": sum(slot["late"] for slot in mine),
            }
        )
    return rows


def attribution(done: list[dict], *, origin: datetime) -> Callable[[datetime | None], str]:
    """The kind a slot is charged to: the last action that ran during its period or the one
    before it (an action's effects last about a period after its end), else ``HEALTHY``.
    ``done``: the actions run, ``at``/``end`` in seconds after ``origin`` (the first slot)."""

    def kind_of(tick: datetime | None) -> str:
        if tick is None:
            return HEALTHY
        offset = (tick - origin).total_seconds()
        hits = [action for action in done if action["at"] - PERIOD < offset <= action["end"] + PERIOD]
        return hits[-1]["kind"] if hits else HEALTHY

    return kind_of


def chances(
    outages: dict[str, list[tuple[float, float]]], *, replicas: list[str], step: float = 0.1
) -> Callable[[datetime], float]:
    """``chance(tick)``: seconds of the slot's period with the database up and at least one
    replica up, from the outage spans (``time.time()`` seconds; ``"database"`` and each replica)."""

    def out(part: str, moment: float) -> bool:
        return any(begin <= moment < end for begin, end in outages.get(part, ()))

    def chance(tick: datetime) -> float:
        start = tick.timestamp()
        moments = [start + index * step for index in range(round(PERIOD / step))]
        return step * sum(
            not out("database", moment) and any(not out(name, moment) for name in replicas)
            for moment in moments
        )

    return chance


def load() -> tuple[list[Write], list[Run]]:
    """The soak job's rows, from the database the ORM is connected to."""
    from locks.models import JobRun
    from tests.jobsapp.models import SlotWrite

    writes = [Write(*row) for row in SlotWrite.objects.filter(job=JOB).values_list("tick", "token", "holder")]
    runs = [
        Run(*row)
        for row in JobRun.objects.for_job(JOB).values_list(
            "tick", "token", "holder", "status", "started_at", "error"
        )
    ]
    return writes, runs
