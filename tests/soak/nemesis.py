"""The soak's nemesis: a schedule of faults drawn from a seed, and its execution.

``plan(seed=…)`` is a pure function: the same seed, duration, kinds and replica count give
the same actions (kind, slot, moment within the slot, target, length, mode), whatever the
machine does. What only the run can tell (which replica holds the lease at that moment) is
resolved when the action runs and logged with it; each action names a drawn replica to
fall back on. Actions run one after another; each is bounded in time, and a plan holds at
most ``MAX_ACTIONS``. An action that comes late (the one before it took longer) keeps its
moment within the slot, at the next slot.

Kinds (``--nemesis``, each selectable on its own):

- ``kill``: SIGKILL a replica (the lease's holder, mostly), restart it 1-8 s later. With
  ``--reminders`` a third of the kills (drawn from the seed apart from the rest of the plan)
  aim at the replica whose ``send_reminders`` run is sending: from a moment before a slot,
  for at most ``LOOK_FOR_REMINDERS``, it waits for a replica to hold that job's lease and for
  the SMTP stand-in to receive 1-8 messages (drawn) after that; none found: it says so and
  kills as the other kills do.
- ``pause``: SIGSTOP the replica that is inside its fenced write (its transaction holds the
  lock row), for longer than the TTL (up to two periods more), then SIGCONT.
- ``term``: SIGTERM a replica (graceful stop, bounded), restart it 1-5 s later.
- ``pg-restart``: ``pg_ctl stop -m fast|immediate`` then start, in the middle of a run.
- ``pg-outage``: the same, with the server down 2-6 s.
- ``skew``: restart a replica under ``faketime`` with an offset within the tick window,
  beyond it, or beyond the period, for 2-4 periods; then restart it with the right clock.
- ``commit-cut``: arm every replica's proxy to cut the next fenced write's COMMIT (mostly
  after the server committed, so the answer is lost; sometimes before it reached it).
- ``failover`` (only with ``--failover sync|async``, then on its own cadence: the first after
  ``FIRST`` slots, then one every ``EVERY`` seconds, whatever else is drawn; ``pg-restart`` and
  ``pg-outage`` are left out, the failover kills the primary itself): async, freeze the replication
  link for 4-14 s from just before a slot; kill the primary, promote the standby, switch the
  application relay, build a fresh standby; resume ``send_reminders`` once the failover paused it
  (``tests/soak/failover.py``).
- ``smtp-lost-reply`` (only with ``--reminders``): from a moment before a slot, for 2-20 s,
  the SMTP stand-in keeps every message's content and then loses its reply: it never answers
  250 (the client gives up after ``EMAIL_TIMEOUT``) or it drops the connection, half each,
  drawn from the seed. Each ``send_reminders`` run in that time leaves one reminder uncertain.

The reminders part also changes what the other kinds hit: ``send_reminders`` runs on the soak
job's slots in every replica, so a pause or a server restart in the middle of a run lands in
a reminders run too, often; a kill aimed at the soak job's holder only by chance (a reminders
run lasts a second or two, on whichever replica took its lease), hence the kills aimed at it.
"""

from __future__ import annotations

import math
import random
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace

from tests.soak import failover as replication
from tests.soak.cluster import Cluster, Replica
from tests.soak.timing import EMAIL_TIMEOUT, PERIOD, RUN_SECONDS, TTL, WORK_SECONDS

KINDS = ("kill", "pause", "term", "pg-restart", "pg-outage", "skew", "commit-cut", "smtp-lost-reply")
SERVER_KINDS = frozenset({"pg-restart", "pg-outage"})
SMTP_KINDS = frozenset({"smtp-lost-reply"})  # need --reminders (the SMTP stand-in)
FAILOVER = replication.KIND  # needs --failover (two clusters); never part of ``all`` without it
MAX_ACTIONS = 500
WINDOW = PERIOD / 4  # the tick window: LOCKS_TICK_WINDOW is capped at a quarter of the gap
# How long an action waits for its moment to come (a holder inside its write, a COMMIT to cut).
LOOK_FOR_WRITER = PERIOD + 2
LOOK_FOR_COMMIT = 2 * PERIOD
LOOK_FOR_REMINDERS = PERIOD + 2  # a send_reminders run that is sending
REMINDER_KILLS = 1 / 3  # with --reminders: the share of kills aimed at a send_reminders run
MAX_MESSAGES = 8  # such a kill comes after 1 to this many of the run's messages (a run has ~15)


@dataclass(frozen=True)
class Action:
    kind: str
    slot: int  # the soak's slot it is aimed at (0: the first one)
    phase: float  # seconds after that slot
    replica: int  # the drawn replica (0-based): the target when it aims at no holder, or finds none
    holder: bool = False  # aim at the lease's holder (pause: the replica inside its fenced write)
    seconds: float = 0.0  # how long the fault lasts: down, paused, skewed, the link frozen (0: a restart)
    mode: str = ""  # pg-*: fast | immediate; commit-cut: after | before; smtp-lost-reply: late | drop; failover: sync | async
    offset: float = 0.0  # skew: the replica's clock offset, seconds
    reminders: bool = False  # kill: aim at the replica whose send_reminders run is sending
    messages: int = 0  # kill aimed at reminders: after this many of its run's messages (or its end)

    @property
    def at(self) -> float:
        """Seconds after the soak's first slot."""
        return self.slot * PERIOD + self.phase

    def describe(self) -> str:
        drawn = f"r{self.replica + 1}"
        target = f"the holder (else {drawn})" if self.holder else drawn
        if self.kind == "kill" and self.reminders:
            return (
                f"SIGKILL the replica sending reminders after {self.messages} of its run's messages "
                f"(else {target}), restart {self.seconds:g} s later"
            )
        if self.kind == "kill":
            return f"SIGKILL {target}, restart {self.seconds:g} s later"
        if self.kind == "pause":
            return f"SIGSTOP the replica inside its fenced write (else {drawn}) for {self.seconds:g} s"
        if self.kind == "term":
            return f"SIGTERM {target}, restart {self.seconds:g} s after it exits"
        if self.kind == "pg-restart":
            return f"restart PostgreSQL (-m {self.mode})"
        if self.kind == "pg-outage":
            return f"stop PostgreSQL (-m {self.mode}) for {self.seconds:g} s"
        if self.kind == "skew":
            return f"restart {drawn} with its clock {self.offset:+g} s off ({skew_band(self.offset)}) for {self.seconds:g} s"
        if self.kind == FAILOVER and self.mode == "async":
            return f"freeze the replication link for {self.seconds:g} s, kill the primary, promote the standby, build a new one"
        if self.kind == FAILOVER:
            return "kill the primary (its standby synchronous), promote the standby, build a new one"
        if self.kind == "smtp-lost-reply":
            how = "never answer 250" if self.mode == "late" else "drop the connection"
            return f"the SMTP stand-in keeps each message, then {how}, for {self.seconds:g} s"
        return f"cut the next fenced COMMIT {self.mode} the server got it"

    def as_json(self) -> dict:
        fields = asdict(self)
        if not self.reminders:
            del fields["reminders"], fields["messages"]  # a plan without --reminders reads as before
        return {**fields, "at": round(self.at, 2), "describe": self.describe()}


def skew_band(offset: float) -> str:
    if abs(offset) <= WINDOW:
        return "within the tick window"
    if abs(offset) < PERIOD:
        return "beyond the tick window"
    return "beyond the period"


def plan(
    *,
    seed: int,
    duration: float,
    kinds: tuple[str, ...],
    replicas: int,
    reminders: bool = False,
    failover: str = "",
) -> list[Action]:
    """The actions of a soak, drawn from ``seed``: the same arguments, the same plan. With
    ``reminders``, some kills aim at a ``send_reminders`` run, drawn from a generator of their
    own: the other draws, and every plan without ``reminders``, stay what the seed gave before.
    With ``failover`` (``sync`` or ``async``) and ``FAILOVER`` among the kinds, a failover comes
    at its own cadence (``replication.FIRST``, ``replication.EVERY``), drawn from a generator of
    its own too; the other kinds fill the time between."""
    rng = random.Random(seed)
    aims = random.Random(f"{seed}:reminder-kills")
    fails = random.Random(f"{seed}:failover")
    next_failover = replication.FIRST * PERIOD if failover and FAILOVER in kinds else math.inf
    kinds = tuple(kind for kind in KINDS if kind in kinds)  # the order given does not matter
    actions: list[Action] = []
    slot = 1  # the first slot runs healthy
    while (kinds or next_failover < math.inf) and len(actions) < MAX_ACTIONS:
        if next_failover <= slot * PERIOD or not kinds:
            slot = max(slot, math.ceil(next_failover / PERIOD))
            action = _draw_failover(fails, mode=failover, slot=slot, replicas=replicas)
            next_failover = action.at + replication.EVERY
            if action.at >= duration:
                break
            actions.append(action)
            slot = math.ceil((action.at + _span(action)) / PERIOD)
            continue
        kind = rng.choice(kinds)
        action = _draw(rng, kind, slot=slot, replicas=replicas)
        if reminders and kind == "kill" and aims.random() < REMINDER_KILLS:
            # From half a second before the next slot: its reminders run, from its start.
            action = replace(
                action, phase=PERIOD - 0.5, reminders=True, messages=aims.randint(1, MAX_MESSAGES)
            )
        if action.at >= duration:
            break
        actions.append(action)
        # The next action at a later slot, after this one's likely end and 0-1 quiet slots.
        slot = math.ceil((action.at + _span(action)) / PERIOD) + rng.randint(0, 1)
    return actions


def _draw(rng: random.Random, kind: str, *, slot: int, replicas: int) -> Action:
    replica = rng.randrange(replicas)
    in_a_run = round(rng.uniform(0.2, RUN_SECONDS + 0.3), 2)  # a run starts at its slot
    if kind == "kill":
        return Action(kind, slot, in_a_run, replica, rng.random() < 0.7, round(rng.uniform(1, 8), 1))
    if kind == "pause":
        # Longer than the lease, up to two periods more: it may span the next slots.
        seconds = round(rng.uniform(TTL + 1, TTL + 2 * PERIOD), 1)
        return Action(kind, slot, WORK_SECONDS, replica, True, seconds)
    if kind == "term":
        return Action(kind, slot, in_a_run, replica, rng.random() < 0.5, round(rng.uniform(1, 5), 1))
    if kind in SERVER_KINDS:
        mode = rng.choice(("fast", "immediate"))
        seconds = round(rng.uniform(2, 6), 1) if kind == "pg-outage" else 0.0
        return Action(kind, slot, in_a_run, replica, seconds=seconds, mode=mode)
    if kind == "skew":
        low, high = rng.choice(((0.5, WINDOW), (WINDOW + 0.5, PERIOD - 2), (PERIOD + 1, 3 * PERIOD)))
        offset = round(rng.choice((-1, 1)) * rng.uniform(low, high), 1)
        seconds = round(rng.uniform(2, 4) * PERIOD)
        return Action(
            kind, slot, round(rng.uniform(2, PERIOD - 2), 2), replica, seconds=seconds, offset=offset
        )
    if kind == "commit-cut":
        mode = "after" if rng.random() < 0.75 else "before"
        return Action(kind, slot, PERIOD - 1, replica, mode=mode)  # armed a second before a slot
    if kind == "smtp-lost-reply":
        mode = "late" if rng.random() < 0.5 else "drop"
        seconds = round(rng.uniform(2, 2 * PERIOD), 1)
        return Action(kind, slot, PERIOD - 0.5, replica, seconds=seconds, mode=mode)  # from before a slot
    raise ValueError(f"unknown nemesis kind {kind!r}")


def _draw_failover(rng: random.Random, *, mode: str, slot: int, replicas: int) -> Action:
    replica = rng.randrange(replicas)  # unused: a failover aims at the primary
    if mode == "async":
        # From just before a slot, for longer than a run's commit after it: its write stays on the primary.
        seconds = round(rng.uniform(*replication.FREEZE), 1)
        return Action(FAILOVER, slot - 1, PERIOD - 1, replica, seconds=seconds, mode=mode)
    return Action(FAILOVER, slot, round(rng.uniform(0.2, RUN_SECONDS + 0.3), 2), replica, mode=mode)


def _span(action: Action) -> float:
    """About how long ``action`` takes, restarts included (Django starts in ~3 s)."""
    restart = 4.0
    return {
        "kill": action.seconds + restart + (1 if action.reminders else 0),  # its run's first message
        "pause": action.seconds + 1,
        "term": RUN_SECONDS + action.seconds + restart,
        "pg-restart": 3.0,
        "pg-outage": action.seconds + 3,
        "skew": action.seconds + 2 * restart,
        "commit-cut": PERIOD + 2,
        "smtp-lost-reply": action.seconds + 2 * EMAIL_TIMEOUT,  # a client waits for the reply, then QUIT's
        # Promote, a fresh standby (a base backup), the pause of send_reminders and its resume.
        FAILOVER: action.seconds + 12 + PERIOD + restart,
    }[action.kind]


class Nemesis:
    """Runs a plan against a cluster. ``holder()`` and ``writer()`` name the replica that holds
    the lease now, and the one inside its fenced write now (None: nobody, or unknown);
    ``smtp`` is the SMTP stand-in (``tests.smtp_standin.SmtpStandin``) of ``--reminders`` and
    ``sender()`` the replica holding the ``send_reminders`` lease now (its run, a child of
    that replica, is under way)."""

    def __init__(
        self,
        *,
        cluster: Cluster,
        start: float,
        holder: Callable[[], str | None],
        writer: Callable[[], str | None],
        log: Callable[[str], None],
        smtp=None,
        sender: Callable[[], str | None] | None = None,
        replication: replication.Replication | None = None,
        paused: Callable[[], tuple[str, str] | None] | None = None,
        resume: Callable[[], tuple[bool, str]] | None = None,
    ) -> None:
        self.replication = replication
        self.paused = paused
        self.resume = resume
        self.smtp = smtp
        self.sender = sender
        self.cluster = cluster
        self.start = start  # time.time() of the soak's first slot
        self.holder = holder
        self.writer = writer
        self.log = log
        self.done: list[dict] = []

    def now(self) -> float:
        return time.time() - self.start

    def run(self, actions: list[Action], *, duration: float) -> list[dict]:
        """Each action at its moment (or the same moment of a later slot, when late), none
        starting at or after ``duration``."""
        for action in actions:
            at = action.at
            if self.now() > at:
                at += math.ceil((self.now() - at) / PERIOD) * PERIOD
            if at >= duration:
                break
            _sleep_until(self.start + at)
            began = self.now()
            target, detail = getattr(self, "_" + action.kind.replace("-", "_"))(action)
            entry = {
                "kind": action.kind,
                "planned": round(action.at, 2),
                "at": round(began, 2),
                "end": round(self.now(), 2),
                "target": target,
                "detail": detail,
            }
            self.done.append(entry)
            self.log(f"nemesis: +{entry['at']:.1f}..+{entry['end']:.1f} s {action.kind} {target}: {detail}")
        _sleep_until(self.start + duration)  # the nemesis phase lasts its duration, actions or not
        return self.done

    def _target(self, action: Action, found: str | None, what: str) -> tuple[Replica, str]:
        """The replica found (``what``), else the drawn one; and how it was chosen."""
        if found is not None:
            return self.cluster.by_name(found), f"{found} ({what})"
        drawn = self.cluster.replicas[action.replica]
        return drawn, f"{drawn.name} (no replica {what} found)" if action.holder else drawn.name

    def _kill(self, action: Action) -> tuple[str, str]:
        aimed = action.reminders and self.sender is not None and self.smtp is not None
        sender, sent = self._sending(action.messages) if aimed else (None, 0)
        if sender is not None:
            replica, target = self.cluster.by_name(sender), f"{sender} (inside its send_reminders run)"
        else:
            replica, target = self._target(
                action, self.holder() if action.holder else None, "holding the lease"
            )
            if aimed:
                target += f" (no send_reminders run sending within {LOOK_FOR_REMINDERS} s)"
        self.cluster.kill_replica(replica)
        time.sleep(action.seconds)
        self.cluster.restart_replica(replica)
        detail = f"SIGKILL, restarted {action.seconds:g} s later"
        if sender is not None:
            detail += f"; the stand-in had received {sent} of its run's messages"
        return target, detail

    def _sending(self, messages: int) -> tuple[str | None, int]:
        """The replica whose ``send_reminders`` run is sending (it holds the lease, and the
        stand-in received ``messages`` since it was first seen holding it: a run that ends
        first is not it), and how many; waits at most ``LOOK_FOR_REMINDERS``."""
        deadline = time.monotonic() + LOOK_FOR_REMINDERS
        seen, since = None, 0
        while time.monotonic() < deadline:
            sender = self.sender()
            with self.smtp.lock:
                arrived = len(self.smtp.arrivals)
            if sender is not None and sender == seen and arrived - since >= messages:
                return sender, arrived - since
            if sender != seen:  # a run's messages count from when its lease is seen held
                seen, since = sender, arrived
            time.sleep(0.02)
        return None, 0

    def _pause(self, action: Action) -> tuple[str, str]:
        deadline = time.monotonic() + LOOK_FOR_WRITER
        found = None
        while found is None and time.monotonic() < deadline:
            found = self.writer()
            if found is None:
                time.sleep(0.05)
        replica, target = self._target(action, found, "inside its fenced write")
        self.cluster.pause_replica(replica)
        time.sleep(action.seconds)
        self.cluster.resume_replica(replica)
        return target, f"SIGSTOP for {action.seconds:g} s (TTL {TTL} s), then SIGCONT"

    def _term(self, action: Action) -> tuple[str, str]:
        replica, target = self._target(action, self.holder() if action.holder else None, "holding the lease")
        stop = self.cluster.stop_replica(replica)
        time.sleep(action.seconds)
        self.cluster.restart_replica(replica)
        stopped = f"exit {stop.code} after {stop.seconds:.1f} s" if stop.code is not None else "did not stop"
        return target, f"SIGTERM: {stopped}; restarted {action.seconds:g} s later"

    def _pg_restart(self, action: Action) -> tuple[str, str]:
        self.cluster.stop_server(action.mode)
        self.cluster.start_server()
        return "PostgreSQL", f"pg_ctl stop -m {action.mode}, start"

    def _pg_outage(self, action: Action) -> tuple[str, str]:
        self.cluster.stop_server(action.mode)
        time.sleep(action.seconds)
        self.cluster.start_server()
        return "PostgreSQL", f"pg_ctl stop -m {action.mode}, down {action.seconds:g} s, start"

    def _skew(self, action: Action) -> tuple[str, str]:
        replica = self.cluster.replicas[action.replica]
        self.cluster.stop_replica(replica)
        self.cluster.restart_replica(replica, offset=action.offset)
        time.sleep(action.seconds)
        self.cluster.stop_replica(replica)
        self.cluster.restart_replica(replica)
        band = skew_band(action.offset)
        return replica.name, f"faketime {action.offset:+g} s ({band}) for {action.seconds:g} s"

    def _commit_cut(self, action: Action) -> tuple[str, str]:
        before = {replica.name: replica.proxy.cut for replica in self.cluster.replicas}
        self.cluster.arm_cuts(mode=action.mode)
        deadline = time.monotonic() + LOOK_FOR_COMMIT
        cut: list[str] = []
        while not cut and time.monotonic() < deadline:
            time.sleep(0.05)
            cut = [
                replica.name for replica in self.cluster.replicas if replica.proxy.cut > before[replica.name]
            ]
        self.cluster.disarm_cuts()
        if not cut:
            return "every proxy", f"no fenced COMMIT within {LOOK_FOR_COMMIT} s; disarmed"
        return ", ".join(cut), f"the connection cut {action.mode} the server got its fenced COMMIT"

    def _smtp_lost_reply(self, action: Action) -> tuple[str, str]:
        before = self._unanswered()
        self.smtp.lose_reply = action.mode
        try:
            time.sleep(action.seconds)
        finally:
            self.smtp.lose_reply = ""
        # The last message may still wait for its client to give up (late): not counted here.
        how = "no 250 (the client times out)" if action.mode == "late" else "the connection dropped after it"
        return (
            "SMTP stand-in",
            f"{self._unanswered() - before} messages kept with {how}, for {action.seconds:g} s",
        )

    def _failover(self, action: Action) -> tuple[str, str]:
        entry = self.replication.fail_over(freeze=action.seconds if action.mode == "async" else 0)
        detail = (
            f"link frozen {entry['killed'] - entry['froze']:.1f} s ({entry['lag_bytes']} bytes unreplicated), "
            if entry["froze"]
            else f"standby synchronous ({entry['lag_bytes']} bytes behind), "
        )
        detail += (
            f"primary killed, standby promoted (timeline {entry['timeline']} to {entry['now']}) and "
            f"switched to in {entry['switched'] - entry['killed']:.1f} s, a new standby in "
            f"{entry['rebuilt'] - entry['switched']:.1f} s"
        )
        if self.paused is not None:
            entry["paused"] = self._await_pause(entry["timeline"])
            if entry["paused"] is None:
                detail += f"; send_reminders not paused by a failover within {replication.LOOK_FOR_PAUSE} s"
            else:
                ok, said = self.resume()
                entry["resumed"] = {"at": time.time(), "ok": ok, "said": said}
                detail += f"; send_reminders paused ({entry['paused']['note'][:90]}…), resumed: {said}"
        return f"the primary (timeline {entry['timeline']})", detail

    def _await_pause(self, timeline: int) -> dict | None:
        """Until ``send_reminders`` is paused by the failover from ``timeline`` (bounded)."""
        deadline = time.monotonic() + replication.LOOK_FOR_PAUSE
        while time.monotonic() < deadline:
            found = self.paused()
            if found is not None and found[0] == replication.PAUSER and f"timeline {timeline} " in found[1]:
                return {"at": time.time(), "by": found[0], "note": found[1]}
            time.sleep(0.2)
        return None

    def _unanswered(self) -> int:
        with self.smtp.lock:
            return sum(not arrival.answered for arrival in self.smtp.arrivals)


def _sleep_until(moment: float) -> None:
    """Bounded: ``moment`` is never more than a plan's span away."""
    while (left := moment - time.time()) > 0:
        time.sleep(min(left, 1.0))


def parse_kinds(text: str) -> tuple[str, ...]:
    """``kill,pause``, ``all`` or ``none`` to kinds in KINDS order; ValueError names the unknown ones."""
    if text.strip() == "all":
        return KINDS
    if text.strip() == "none":
        return ()
    given = {part.strip() for part in text.split(",") if part.strip()}
    unknown = sorted(given - {*KINDS, FAILOVER})
    if unknown or not given:
        raise ValueError(
            f"unknown nemesis kind(s) {', '.join(unknown) or '(none given)'}; "
            f"known: {', '.join(KINDS)}, {FAILOVER}, or all, or none"
        )
    return tuple(kind for kind in (*KINDS, FAILOVER) if kind in given)
