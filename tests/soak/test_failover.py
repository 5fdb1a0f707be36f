"""The failover nemesis's checks on made-up histories (tests/soak/failover.py): a clean history of
each replication mode passes, and each rule fails on the history that breaks it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from tests.faults.pgproxy import sets
from tests.soak import checker, failover, reminders
from tests.soak.checker import Run, Write
from tests.soak.cluster import FENCED_RENEWAL
from tests.soak.timing import PERIOD

ORIGIN = datetime(2026, 12, 3, 10, 0, tzinfo=UTC)
T = ORIGIN.timestamp()
WINDOW = [ORIGIN + timedelta(seconds=PERIOD * index) for index in range(6)]
HOLDER = "vm:101:abcdef"
OLD = "the database failed over since token 3 was granted on timeline 1 (now timeline 2): a run of that history may be lost, or may have done its work there too"
SYNC_CHECKS = ["failovers-done", "no-slot-twice", "succeeded-with-its-write"]
ASYNC_CHECKS = [
    "failovers-done",
    "repeats-named",
    "lost-writes-only-unreplicated",
    "succeeded-with-its-write",
]
MAIL_CHECKS = ["reminders-paused-on-failover", "emails-across-failovers"]


def slot(index: int) -> datetime:
    return WINDOW[index]


def one_failover(*, froze: float | None = None) -> dict:
    """Timeline 1 to 2: killed at +25 s, switched at +26 s, a new standby by +28 s; send_reminders
    paused at +31 s and resumed at +33 s."""
    return {
        "mode": "async" if froze else "sync",
        "began": T + 24.0,
        "froze": froze,
        "lag_bytes": 4096 if froze else 0,
        "timeline": 1,
        "killed": T + 25.0,
        "switched": T + 26.0,
        "now": 2,
        "rebuilt": T + 28.0,
        "paused": {"at": T + 31.0, "by": failover.PAUSER, "note": f"paused on a database failover: {OLD}"},
        "resumed": {"at": T + 33.0, "ok": True, "said": "exit 0: Resumed send_reminders"},
    }


def history(mode: str = "sync") -> dict:
    """Every slot written once by token index+1 and acknowledged 1.5 s after it; one failover."""
    return {
        "mode": mode,
        "failovers": [one_failover(froze=T + 19.0 if mode == "async" else None)],
        "acks": [failover.Ack(tick, index + 1, tick.timestamp() + 1.5) for index, tick in enumerate(WINDOW)],
        "writes": [Write(tick, index + 1, HOLDER) for index, tick in enumerate(WINDOW)],
        "runs": [Run(tick, index + 1, HOLDER, "succeeded", tick) for index, tick in enumerate(WINDOW)],
        "timelines": {
            (tick, index + 1): 1 if index < 3 or mode == "one-server" else 2
            for index, tick in enumerate(WINDOW)
        },
        "lock": (slot(5), True, 6),
        "warned": [],
        "ledger": {},
        "window": WINDOW,
        "duration": 60,
        "reminders": False,
        "resends": [],
    }


def judge(**given) -> dict[str, checker.Check]:
    checks, _row = judge_with_row(**given)
    return checks


def judge_with_row(**given) -> tuple[dict[str, checker.Check], dict]:
    checks, row = failover.judge(
        label=lambda tick: f"+{(tick - ORIGIN).total_seconds():.0f}s" if tick else "forced",
        job="soak",
        **given,
    )
    return {check.name: check for check in checks}, row


def failing(checks: dict[str, checker.Check]) -> dict[str, str]:
    return {name: check.detail for name, check in checks.items() if not check.passed}


def async_repeat() -> dict:
    """Async: slot 2's write (token 3) acknowledged at +21.5 s, the link frozen since +19 s, lost
    at the failover; slot 2 ran again after it (token 3 again on timeline 2, acknowledged at +29.5 s)."""
    given = history("async")
    given["acks"].append(failover.Ack(slot(2), 3, T + 29.5))
    given["timelines"][(slot(2), 3)] = 2  # the row that survived is the second run's
    given["warned"] = [{"job": "soak", "timeline": 1, "now": 2}]
    given["ledger"] = {slot(2).isoformat(): OLD}
    return given


def test_a_clean_history_of_each_mode_passes_every_check():
    sync = judge(**history("sync"))
    assert list(sync) == SYNC_CHECKS and not failing(sync)
    asynchronous = judge(**history("async"))
    assert list(asynchronous) == ASYNC_CHECKS and not failing(asynchronous)
    with_mail = judge(**{**history("sync"), "reminders": True})
    assert list(with_mail) == SYNC_CHECKS + MAIL_CHECKS and not failing(with_mail)


def test_an_answer_belongs_to_the_history_of_the_failovers_switched_before_it():
    failovers = [one_failover(), {**one_failover(), "switched": T + 90.0}]

    assert [failover.epoch(T + moment, failovers) for moment in (25.9, 26.0, 89.0, 95.0)] == [0, 1, 1, 2]


def test_a_fenced_write_is_the_statement_that_sets_committed_token_not_the_release_that_matches_it():
    renewal = b'UPDATE "locks_synclock" SET "locked_until" = now(), "committed_token" = 7, "tick" = \'2026-12-03 10:00:10+00:00\'::timestamptz WHERE ("locks_synclock"."token" = 7)'
    release = b'UPDATE "locks_synclock" SET "holder" = \'\', "tick" = \'2026-12-03 10:00:10+00:00\'::timestamptz WHERE ("locks_synclock"."committed_token" = 7)'

    assert sets(FENCED_RENEWAL, renewal) and not sets(FENCED_RENEWAL, release)
    assert failover.tick_of(renewal) == ORIGIN + timedelta(seconds=10)
    assert failover.tick_of(b"COMMIT") is None


def test_sync_a_slot_acknowledged_before_and_after_a_failover_ran_twice():
    given = history("sync")
    given["acks"].append(failover.Ack(slot(2), 7, T + 29.5))  # slot 2 acknowledged again on timeline 2

    checks, row = judge_with_row(**given)

    assert failing(checks) == {
        "no-slot-twice": "1 slot acknowledged more than once: +20s (timeline 1: WARNING no, ledger no)"
    }
    assert (row["repeats"], row["detected"], row["silent"]) == (1, 0, 1)


def test_async_a_slot_run_again_after_a_failover_is_detected_when_the_warning_and_the_ledger_name_it():
    checks, row = judge_with_row(**async_repeat())

    assert not failing(checks)
    assert checks["repeats-named"].detail == (
        "1 slot acknowledged in two histories, each named by the WARNING and the ledger: "
        "+20s (timeline 1: WARNING yes, ledger yes)"
    )
    assert (row["repeats"], row["detected"], row["silent"]) == (1, 1, 0)


def test_async_a_repeat_without_the_warning_or_without_the_ledger_is_silent():
    no_ledger = {**async_repeat(), "ledger": {}}
    assert failing(judge(**no_ledger)) == {
        "repeats-named": "1 silent repeat: +20s (timeline 1: WARNING yes, ledger no)"
    }
    other_job = {**async_repeat(), "warned": [{"job": "send_reminders", "timeline": 1, "now": 2}]}
    assert failing(judge(**other_job)) == {
        "repeats-named": "1 silent repeat: +20s (timeline 1: WARNING no, ledger yes)"
    }
    other_failover = {
        **async_repeat(),
        "ledger": {slot(2).isoformat(): OLD.replace("timeline 1 ", "timeline 4 ")},
    }
    assert "ledger no" in failing(judge(**other_failover))["repeats-named"]


def test_async_two_acknowledged_writes_of_a_slot_in_one_history_are_a_silent_repeat_whatever_names_it():
    given = async_repeat()
    given["acks"][-1] = failover.Ack(slot(2), 9, T + 22.0)  # before the switch: the same history

    assert "1 silent repeat: +20s" in failing(judge(**given))["repeats-named"]


def test_async_an_acknowledged_write_lost_outside_its_failovers_frozen_link_fails():
    given = async_repeat()
    assert (
        "1 acknowledged write lost, each acknowledged while"
        in judge(**given)["lost-writes-only-unreplicated"].detail
    )
    given["writes"] = [write for write in given["writes"] if write.tick != slot(1)]
    given["runs"] = [run for run in given["runs"] if run.tick != slot(1)]

    assert failing(judge(**given)) == {
        # slot 1's write was acknowledged at +11.5 s, before the link froze at +19 s
        "lost-writes-only-unreplicated": "1 acknowledged write lost outside a frozen link: +10s token 2"
    }


def test_a_success_without_its_write_in_the_surviving_database_fails_and_is_counted():
    given = history("async")
    given["writes"] = [write for write in given["writes"] if write.tick != slot(4)]
    given["acks"] = [ack for ack in given["acks"] if ack.tick != slot(4)]
    given["lock"] = (slot(5), True, 8)

    checks, row = judge_with_row(**given)

    assert failing(checks) == {
        "succeeded-with-its-write": "2 succeeded runs without its write: +40s token 5; the lock row: +50s done, "
        "committed_token 8, no such write"
    }
    assert row["succeeded_without_write"] == 2


def test_too_few_failovers_or_one_left_half_done_fail():
    assert (
        "1 failover of 1 done (at least 5 needed)"
        in failing(judge(**{**history(), "duration": 600}))["failovers-done"]
    )
    half = history()
    half["failovers"] = [{**one_failover(), "rebuilt": None}]
    assert "0 failovers of 1 done (at least 1 needed)" in failing(judge(**half))["failovers-done"]


def test_a_failover_that_did_not_pause_send_reminders_or_whose_resume_failed_fails():
    given = {**history(), "reminders": True}
    given["failovers"] = [{**one_failover(), "paused": None, "resumed": None}]
    assert failing(judge(**given)) == {
        "reminders-paused-on-failover": "1 failover without its pause and resume: timeline 1→2: not paused"
    }
    given["failovers"] = [{**one_failover(), "resumed": {"at": T + 33.0, "ok": False, "said": "exit 1"}}]
    assert "timeline 1→2: not resumed" in failing(judge(**given))["reminders-paused-on-failover"]


def test_an_email_sent_again_across_a_failover_fails_in_sync_and_is_detected_in_async_after_its_pause():
    resend = {"key": ["user1@example.com", "Reminder: Round 1"], "before": T + 22.0, "again": T + 40.0}
    sync = {**history("sync"), "reminders": True, "resends": [resend]}
    checks, row = judge_with_row(**sync)
    assert failing(checks) == {
        "emails-across-failovers": "1 email sent again across a failover: user1@example.com (Reminder: Round 1)"
    }
    assert (row["emails_twice"], row["emails_silent"]) == (1, 1)

    asynchronous = {**history("async"), "reminders": True, "resends": [resend]}
    checks, row = judge_with_row(**asynchronous)
    assert not failing(checks) and (row["emails_twice"], row["emails_detected"], row["emails_silent"]) == (
        1,
        1,
        0,
    )

    early = {**resend, "again": T + 30.0}  # before the pause at +31 s named the failover
    asynchronous["resends"] = [early]
    assert (
        "1 email sent again across a failover with no pause naming it first"
        in failing(judge(**asynchronous))["emails-across-failovers"]
    )


def test_the_reminders_judge_sets_a_re_send_across_a_failover_aside_unless_a_kill_of_its_run_explains_it():
    key = ("user1@example.com", "Reminder: Round 1")
    rows = [reminders.ReminderRow(1, key, ORIGIN, "delivered")]
    copies = [reminders.Copy(key, T + 22.0, True), reminders.Copy(key, T + 40.0, True)]
    given = {"reminders": rows, "copies": copies, "last": slot(5), "origin": T, "record_every": 50}

    found, table = reminders.judge(runs=[], kills=[], failovers=(T + 25.0,), **given)
    assert all(check.passed for check in found)
    assert table["failover_resends"] == [{"key": list(key), "before": T + 22.0, "again": T + 40.0}]

    killed = reminders.Kill("r2", T + 30.0, frozenset({202}))
    found, table = reminders.judge(
        runs=[("vm:202:bb", "abandoned")], kills=[killed], failovers=(T + 25.0,), **given
    )
    assert table["failover_resends"] == [] and table["charged"] == 1

    found, table = reminders.judge(runs=[], kills=[], **given)  # no failover: reminder-once's to fail
    assert not next(check for check in found if check.name == "reminder-once").passed
    assert "failover_resends" not in table
