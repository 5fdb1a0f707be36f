"""The soak's ``failover`` nemesis (``--failover sync|async``) and its checks.

The soak's database becomes a primary and a streaming standby (``tests/faults/replication.py``,
the failover tests' two-cluster harness): the replicas' proxies reach it through the switchable
application relay, the standby is fed through the link relay. Sync: ``synchronous_standby_names
= '*'`` (``synchronous_commit = on``); async: empty. Each failover (``Replication.fail_over``):

1. async only: freeze the replication link (the relay stops delivering, both ways) for a drawn
   4-14 s from just before a slot, so that the commits of that time stay on the primary only, as
   an asynchronous failover loses them; sync: the standby must be synchronous, and the kill lands
   in the middle of a run;
2. kill the primary (``pg_ctl stop -m immediate``), promote the standby, switch the application
   relay to it (its open connections are cut, as when a virtual IP moves);
3. build a fresh standby from the new primary (``pg_basebackup -R``), streaming (sync: and
   synchronous), so that the next failover can happen;
4. with ``--reminders``: wait for ``send_reminders`` to be paused by ``locks:failover`` (its
   ``on_failover`` is "pause"; the note names this failover's old timeline), then resume it as an
   operator would, through ``manage.py locks resume send_reminders``.

Every step is bounded in time (the servers' own ``-t``, the relays' timeouts, the waits below).

The checks (``judge``, pure, tested on made-up histories in tests/soak/test_checker.py) read the
proxies' acknowledged fenced writes, each placed in the database history it was acknowledged in
(before or after each failover's switch), the surviving database, the replicas' WARNING lines
and the tick ledger (``locks ticks soak --json``).
"""

from __future__ import annotations

import contextlib
import re
import shutil
import subprocess
import time
from collections import defaultdict
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

import psycopg

from tests.faults.replication import Pair, make_template, unavailable_reason, workdir
from tests.soak.checker import Check, listed, plural
from tests.soak.cluster import HarnessError
from tests.soak.timing import PERIOD

MODES = ("sync", "async")
KIND = "failover"
FIRST = 3  # the first failover's slot (seconds: FIRST * PERIOD after the first slot)
EVERY = 80  # seconds from one failover to the next: six or seven in ten minutes
SECONDS_PER_FAILOVER = 120  # the least a soak must do: one per this many seconds (five in 600 s)
FREEZE = (4.0, 14.0)  # async: how long the link is frozen before the kill (a period and more)
LOOK_FOR_PAUSE = 3 * PERIOD  # a send_reminders run on the new primary pauses the job
PAUSER = "locks:failover"  # locks.runner.FAILOVER_PAUSER: who a failover's pause names
SERVER_CONF = "max_connections = 200"
WARNING = re.compile(
    r" WARNING .*job=(?P<job>\S+) token=\S+ the database failed over since token (?P<token>\d+) was granted "
    r"on timeline (?P<timeline>\d+) \(now timeline (?P<now>\d+)"
)
TICK = re.compile(rb'"tick" = \'([^\']+)\'')


def unavailable() -> str | None:
    return unavailable_reason()


@dataclass(frozen=True)
class Ack:
    """A fenced write of the soak job the server acknowledged, as a proxy saw it."""

    tick: datetime | None
    token: int
    committed: float  # time.time() of the server's answer to its COMMIT


def tick_of(statement: bytes) -> datetime | None:
    """The tick a fenced renewal re-asserts (psycopg binds on the client: the statement has it)."""
    found = TICK.search(statement)
    return datetime.fromisoformat(found[1].decode()) if found else None


def warnings(lines: list[str]) -> list[dict]:
    """The failover WARNINGs (locks.lease: one per job and failover, by the first winner)."""
    found = []
    for line in lines:
        if match := WARNING.search(line):
            found.append({"job": match["job"], "timeline": int(match["timeline"]), "now": int(match["now"])})
    return found


class Replication:
    """The soak's two clusters, and the failovers it makes of them."""

    def __init__(self, mode: str, *, log: Callable[[str], None]) -> None:
        self.mode = mode
        self.log = log
        self.done: list[dict] = []
        root = workdir()
        try:
            template = make_template(root, migrate=lambda url: None)  # the soak migrates its own database
            self.pair = Pair.create(template, synchronous=mode == "sync", conf=SERVER_CONF)
        finally:
            shutil.rmtree(root, ignore_errors=True)
        if mode == "sync":
            self.pair.wait_synchronous()

    @property
    def admin_url(self) -> str:
        return f"postgres://postgres@127.0.0.1:{self.pair.app.port}/postgres"

    def timeline(self, cluster) -> int:
        return int(str(cluster.one("SELECT substr(pg_walfile_name(pg_current_wal_lsn()), 1, 8)")), 16)

    def fail_over(self, *, freeze: float) -> dict:
        """One failover (steps 1-3 of the module's docstring); what it did, times on ``time.time()``.
        A step that fails leaves its entry incomplete (``failovers-done`` counts it) and raises
        ``HarnessError``: without a standby the soak cannot go on."""
        pair = self.pair
        entry: dict = {"mode": self.mode, "began": time.time(), "froze": None, "lag_bytes": None}
        entry |= dict.fromkeys(("timeline", "killed", "switched", "now", "rebuilt"))
        self.done.append(entry)
        step = "the standby synchronous"
        try:
            if self.mode == "sync":
                pair.wait_synchronous(timeout=PERIOD)
            entry["timeline"] = self.timeline(pair.primary)
            if freeze:
                pair.link.freeze()
                entry["froze"] = time.time()
                time.sleep(freeze)
            with contextlib.suppress(psycopg.Error):
                entry["lag_bytes"] = pair.lag()
            step = "kill, promote, switch"
            entry["killed"] = time.time()
            pair.fail_over()
            entry["switched"] = time.time()
            entry["now"] = self.timeline(pair.standby)
            step = "a fresh standby"
            pair.rebuild()
            entry["rebuilt"] = time.time()
        except (AssertionError, RuntimeError, OSError, subprocess.TimeoutExpired, psycopg.Error) as exc:
            raise HarnessError(
                f"failover {len(self.done)} ({step}): {' '.join(str(exc).split())[:500]}"
            ) from None
        return entry

    def destroy(self) -> None:
        self.pair.destroy()


def epoch(moment: float, failovers: list[dict]) -> int:
    """The database history an answer at ``moment`` came from: the failovers switched before it."""
    return sum(failover["switched"] is not None and failover["switched"] <= moment for failover in failovers)


MOMENTS = ("began", "froze", "killed", "switched", "rebuilt")  # a failover's times


def relative(failover: dict, *, origin: float) -> dict:
    """A failover entry for the record: its moments in seconds after ``origin`` (the first slot)."""

    def at(value):
        return round(value - origin, 2) if isinstance(value, float) else value

    entry = {key: at(value) if key in MOMENTS else value for key, value in failover.items()}
    for key in ("paused", "resumed"):
        if failover.get(key):
            entry[key] = {**failover[key], "at": at(failover[key]["at"])}
    return entry


def timeline_of(history: int, failovers: list[dict]) -> int | None:
    """The WAL timeline of a database history (None: one server, never failed over)."""
    if not failovers:
        return None
    return failovers[history]["timeline"] if history < len(failovers) else failovers[-1]["now"]


def lost_acks(acks: list[Ack], writes: list, *, failovers: list[dict], timelines: dict) -> list[Ack]:
    """The acknowledged fenced writes the surviving database lacks. Tokens repeat across histories
    (a token granted on an old primary only is granted again on the new one), so a write is kept
    only when its row survives and its run (``timelines``: (tick, token) to the timeline its
    lease was granted on) is of the history that acknowledged it."""
    written = {(write.tick, write.token) for write in writes}
    return [
        ack
        for ack in acks
        if (ack.tick, ack.token) not in written
        or (
            failovers
            and timelines.get((ack.tick, ack.token))
            != timeline_of(epoch(ack.committed, failovers), failovers)
        )
    ]


def judge(
    *,
    mode: str,
    failovers: list[dict],
    acks: list[Ack],
    writes: list,
    runs: list,
    timelines: dict,
    lock: tuple | None,
    warned: list[dict],
    ledger: dict[str, str],
    window: list[datetime],
    duration: float,
    reminders: bool,
    resends: list[dict],
    label: Callable[[datetime | None], str],
    job: str,
) -> tuple[list[Check], dict]:
    """The failover checks and the record's replication row (``mode`` "one-server" for a soak
    without failovers: its row only). In async mode the driver keeps the acknowledged writes the
    surviving database lacks (``lost_acks``) out of ``acknowledged-commits-kept``: this module's
    ``lost-writes-only-unreplicated`` judges them instead.

    ``failovers``: ``Replication.fail_over`` entries (plus ``paused``/``resumed`` from the nemesis);
    ``writes``/``runs``: the surviving ``SlotWrite`` rows and ``JobRun`` rows (``checker.Write``,
    ``checker.Run``); ``timelines``: each run's (tick, token) to its timeline; ``lock``: the job's lock row ``(tick, tick_done,
    committed_token)``; ``warned``: ``warnings()`` of every replica; ``ledger``: slot (ISO) to its
    ``failover`` text; ``resends``: the reminders' re-sends across a failover that no SIGKILL of
    a reminders run explains (``{"key", "before", "again"}``, times on ``time.time()``).
    """
    written = {(write.tick, write.token) for write in writes}
    acked: dict[datetime | None, list[int]] = defaultdict(list)
    for ack in acks:
        acked[ack.tick].append(epoch(ack.committed, failovers))
    # A slot run twice: more than one of its fenced writes acknowledged. In two histories, a repeat
    # a failover may cause (named or silent); twice in one, a duplicate (silent, whatever else says).
    repeats = sorted(
        (tick for tick, epochs in acked.items() if len(epochs) > 1), key=lambda t: t or datetime.min
    )

    def failover_after(history: int) -> dict | None:
        return failovers[history] if history < len(failovers) else None

    named, silent = [], []
    for tick in repeats:
        histories = sorted(acked[tick])
        first = failover_after(histories[0])  # the failover that lost its first acknowledged write
        old = first["timeline"] if first else None
        warned_of = old is not None and any(w["job"] == job and w["timeline"] == old for w in warned)
        in_ledger = old is not None and f"granted on timeline {old} " in ledger.get(
            tick.isoformat() if tick else "", ""
        )
        twice_in_one = len(set(histories)) < len(histories)
        (named if warned_of and in_ledger and not twice_in_one else silent).append(
            (tick, old, warned_of, in_ledger)
        )

    lost = lost_acks(acks, writes, failovers=failovers, timelines=timelines)
    unreplicated = []
    for ack in lost:
        failover = failover_after(epoch(ack.committed, failovers))
        frozen = failover is not None and None not in (failover["froze"], failover["killed"])
        if frozen and failover["froze"] <= ack.committed <= failover["killed"]:
            unreplicated.append(ack)
    unexplained = [ack for ack in lost if ack not in unreplicated]

    succeeded = [run for run in runs if run.status == "succeeded"]
    without = [
        f"{label(run.tick)} token {run.token}" for run in succeeded if (run.tick, run.token) not in written
    ]
    if lock is not None and lock[1] and (lock[0], lock[2]) not in written:
        without.append(f"the lock row: {label(lock[0])} done, committed_token {lock[2]}, no such write")

    complete = [f for f in failovers if f.get("rebuilt") is not None]
    minimum = max(1, int(duration // SECONDS_PER_FAILOVER))
    checks = [
        Check(
            "failovers-done",
            len(complete) == len(failovers) and len(complete) >= minimum,
            f"{plural(len(complete), 'failover')} of {len(failovers)} done (at least {minimum} needed): "
            + "; ".join(
                f"timeline {f['timeline']}→{f.get('now')}"
                + (
                    f" after {f['killed'] - f['froze']:.1f} s frozen, {f['lag_bytes']} bytes unreplicated"
                    if f["froze"] and f["killed"]
                    else ""
                )
                for f in failovers
            ),
        )
    ]

    def show(item: tuple) -> str:
        tick, old, warned_of, in_ledger = item
        return f"{label(tick)} (timeline {old}: WARNING {'yes' if warned_of else 'no'}, ledger {'yes' if in_ledger else 'no'})"

    if mode == "sync":
        checks.append(
            Check(
                "no-slot-twice",
                not repeats,
                listed(
                    f"{plural(len(repeats), 'slot')} acknowledged more than once",
                    [show(i) for i in named + silent],
                )
                if repeats
                else f"no slot acknowledged more than once ({len(acks)} acknowledged fenced writes of {len(acked)} slots)",
            )
        )
    else:
        checks.append(
            Check(
                "repeats-named",
                not silent,
                listed(f"{plural(len(silent), 'silent repeat')}", [show(i) for i in silent])
                if silent
                else f"{plural(len(named), 'slot')} acknowledged in two histories, each named by the WARNING and the ledger: "
                + (", ".join(show(i) for i in named) or "none"),
            )
        )
        checks.append(
            Check(
                "lost-writes-only-unreplicated",
                not unexplained,
                listed(
                    f"{plural(len(unexplained), 'acknowledged write')} lost outside a frozen link",
                    [f"{label(a.tick)} token {a.token}" for a in unexplained],
                )
                if unexplained
                else f"{plural(len(unreplicated), 'acknowledged write')} lost, each acknowledged while its failover's link was frozen",
            )
        )
    checks.append(
        Check(
            "succeeded-with-its-write",
            not without,
            listed(f"{plural(len(without), 'succeeded run')} without its write", without)
            if without
            else f"all {len(succeeded)} succeeded runs have their rows"
            + (f"; the lock row's done tick {label(lock[0])} has its write" if lock and lock[1] else ""),
        )
    )
    if reminders:
        bad = [
            f"timeline {f['timeline']}→{f.get('now')}: "
            + (
                "not paused"
                if not f.get("paused")
                else "not resumed"
                if not (f.get("resumed") or {}).get("ok")
                else "?"
            )
            for f in failovers
            if not f.get("paused") or not (f.get("resumed") or {}).get("ok")
        ]
        checks.append(
            Check(
                "reminders-paused-on-failover",
                not bad,
                listed(f"{plural(len(bad), 'failover')} without its pause and resume", bad)
                if bad
                else f"all {len(failovers)} failovers paused send_reminders ({PAUSER}, the note naming the old timeline); each resumed by `locks resume`",
            )
        )
        named_mail = [r for r in resends if mode == "async" and _named_resend(r, failovers)]
        silent_mail = [r for r in resends if r not in named_mail]
        checks.append(
            Check(
                "emails-across-failovers",
                not silent_mail,
                listed(
                    f"{plural(len(silent_mail), 'email')} sent again across a failover"
                    + (" with no pause naming it first" if mode == "async" else ""),
                    [f"{r['key'][0]} ({r['key'][1]})" for r in silent_mail],
                )
                if silent_mail
                else f"{plural(len(resends), 'email')} sent again across a failover"
                + (", each after the pause that named it" if resends else ""),
            )
        )
    else:
        named_mail, silent_mail = [], []
    row = {
        "mode": mode,
        "failovers": len(complete),
        "slots": len(window),
        "repeats": len(repeats),
        "detected": len(named),
        "silent": len(silent),
        "acknowledged_lost": len(lost),
        "emails_twice": len(resends) if reminders else None,
        "emails_detected": len(named_mail) if reminders else None,
        "emails_silent": len(silent_mail) if reminders else None,
        "succeeded_without_write": len(without),
    }
    return checks, row


def _named_resend(resend: dict, failovers: list[dict]) -> bool:
    """Whether a failover between the two copies paused send_reminders before the second."""
    return any(
        f["killed"] is not None
        and resend["before"] < f["killed"] < resend["again"]
        and f.get("paused")
        and f["paused"]["at"] <= resend["again"]
        for f in failovers
    )
