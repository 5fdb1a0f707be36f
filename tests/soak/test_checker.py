"""The soak's checker on made-up histories: a clean one passes, and each rule it enforces fails
on the history that breaks it (so that a soak that passes says something)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tests.soak import checker, reminders
from tests.soak.checker import HEALTHY, FencedCommit, Run, Write
from tests.soak.timing import PERIOD, TTL

ORIGIN = datetime(2026, 12, 2, 10, 0, tzinfo=UTC)
WINDOW = [ORIGIN + timedelta(seconds=PERIOD * index) for index in range(4)]
HOLDER = "vm:101:abcdef"


def slot(index: int) -> datetime:
    return WINDOW[index]


def clean() -> dict:
    """Every slot written once by token index+1, whose run succeeded, committed in a second."""
    return {
        "writes": [Write(tick, index + 1, HOLDER) for index, tick in enumerate(WINDOW)],
        "runs": [
            Run(tick, index + 1, HOLDER, "succeeded", tick + timedelta(seconds=0.1))
            for index, tick in enumerate(WINDOW)
        ],
        "commits": [FencedCommit(index + 1, 1.0) for index in range(len(WINDOW))],
        "skips": [{"replica": "r2.1", "tick": slot(0), "reason": f"held by {HOLDER}", "seconds": 0.03}],
        "tracebacks": [],
        "stops": [{"replica": "r1", "at": 40.0, "code": 0, "seconds": 1.2, "asked": True}],
        "chance": lambda tick: float(PERIOD),
        "catch_up": "",
    }


def judge(**history) -> checker.Verdict:
    return checker.judge(
        window=WINDOW,
        kinds=("kill", "pause"),
        kind_of=checker.attribution([{"kind": "kill", "at": 10.5, "end": 14.0}], origin=ORIGIN),
        label=lambda tick: f"+{(tick - ORIGIN).total_seconds():.0f}s" if tick else "forced",
        **history,
    )


def failing(verdict: checker.Verdict) -> dict[str, str]:
    return {check.name: check.detail for check in verdict.checks if not check.passed}


def row(verdict: checker.Verdict, kind: str) -> dict:
    return next(found for found in verdict.table if found["kind"] == kind)


def test_a_clean_history_passes_every_check():
    verdict = judge(**clean())

    assert verdict.passed, failing(verdict)
    assert [check.name for check in verdict.checks] == list(checker.CHECKS)
    assert row(verdict, "all") == {
        "kind": "all",
        **{"slots": 4, "duplicates": 0, "lost": 0, "excused": 0, "stale": 0},
        **{"running": 0, "waits": 0, "success_mismatch": 0, "late": 0},
    }
    # The kill from +10.5 to +14 s is charged the slot it falls in (+10) and the next one (+20).
    assert [row(verdict, kind)["slots"] for kind in ("kill", "pause", HEALTHY)] == [2, 0, 2]


def test_a_slot_written_twice_is_a_duplicate_and_not_one_success():
    history = clean()
    history["writes"].append(Write(slot(1), 9, "vm:102:fedcba"))
    history["runs"].append(Run(slot(1), 9, "vm:102:fedcba", "succeeded", slot(1) + timedelta(seconds=5)))

    verdict = judge(**history)

    assert failing(verdict) == {
        "one-write-per-slot": "1 slot written twice: +10s tokens [2, 9]",
        "one-success-per-slot": "1 slot whose succeeded runs are not exactly the one that wrote its row: "
        "+10s rows by tokens [2, 9], succeeded runs [2, 9]",
    }
    assert (row(verdict, "kill")["duplicates"], row(verdict, "all")["duplicates"]) == (1, 1)


@pytest.mark.parametrize(
    ("catch_up", "chance", "lost", "excused"),
    [
        ("", PERIOD, 1, 0),  # a replica and the database were there all along: lost
        ("", 1.0, 0, 1),  # 1 s of chance: the "latest" policy may miss it
        ("all", 1.0, 1, 0),  # catch_up "all" promises every slot
    ],
)
def test_a_slot_without_its_row_is_lost_unless_it_had_no_chance_under_the_latest_policy(
    catch_up, chance, lost, excused
):
    history = clean()
    del history["writes"][2], history["runs"][2], history["commits"][2]
    history.update(catch_up=catch_up, chance=lambda tick: chance if tick == slot(2) else float(PERIOD))

    verdict = judge(**history)

    assert (row(verdict, "all")["lost"], row(verdict, "all")["excused"]) == (lost, excused)
    assert verdict.check("no-lost-slot").passed is (lost == 0), verdict.check("no-lost-slot").detail
    if lost:
        assert verdict.check("no-lost-slot").detail.startswith(
            f"1 slot lost with a chance to run (catch_up {catch_up!r})"
            if catch_up
            else "1 slot lost with a chance to run (catch_up not set: the default, latest)"
        )
    assert set(failing(verdict)) <= {"no-lost-slot"}


def test_rows_not_written_under_a_lease_that_held_the_slot_are_stale():
    history = clean()
    history["runs"][0] = Run(
        slot(0), 1, HOLDER, "lost_lock", slot(0), "lease on soak (token 1) was taken over"
    )
    del history["runs"][1]  # token 2 never recorded a run
    history["commits"][3] = FencedCommit(4, TTL + 12.5)  # committed long after its lease ended

    verdict = judge(**history)

    assert verdict.stale == [
        {
            "slot": "+0s",
            "kind": HEALTHY,
            "token": 1,
            "why": "its run (token 1) ended lost_lock: lease on soak (token 1) was taken over",
        },
        {"slot": "+10s", "kind": "kill", "token": 2, "why": "no JobRun has token 2"},
        {
            "slot": "+30s",
            "kind": HEALTHY,
            "token": 4,
            "why": "its fenced write (token 4) committed 16.5 s after its renewal, past its 4 s lease "
            "(its run says succeeded)",
        },
    ]
    assert not verdict.check("writes-under-their-lease").passed
    assert row(verdict, "all")["stale"] == 3


def test_a_fenced_write_the_server_acknowledged_and_then_lost_fails_its_own_check():
    history = clean()
    del history["writes"][1], history["runs"][1]  # gone after a crash; its proxy saw it acknowledged

    verdict = judge(**history)

    assert verdict.check("acknowledged-commits-kept").detail == (
        "the server acknowledged 1 fenced write it no longer has: token 2"
    )
    assert set(failing(verdict)) == {"acknowledged-commits-kept", "no-lost-slot"}


def test_a_commit_just_within_the_tolerance_is_not_stale():
    history = clean()
    history["commits"][0] = FencedCommit(1, TTL + checker.COMMIT_TOLERANCE)

    assert judge(**history).check("writes-under-their-lease").passed


def test_runs_left_running_tracebacks_long_waits_and_bad_stops_each_fail_their_check():
    history = clean()
    history["runs"].append(Run(slot(3), 7, HOLDER, "running", slot(3)))
    history["tracebacks"] = ["r2.1: RuntimeError: boom"]
    history["skips"].append(
        {"replica": "r3.2", "tick": slot(1), "reason": "tick +10s already done", "seconds": TTL + 11.7}
    )
    history["stops"] += [
        {"replica": "r2", "at": 12.0, "code": None, "seconds": 20.0, "asked": True},
        {"replica": "r3", "at": 50.0, "code": -15, "seconds": 0.1, "asked": True},
        {"replica": "r1", "at": 61.0, "code": 0, "seconds": 0.0, "asked": False},
    ]

    verdict = judge(**history)

    assert failing(verdict) == {
        "no-run-left-running": "1 run left running: +30s token 7",
        "no-traceback": "1 traceback: r2.1: RuntimeError: boom",
        "bounded-waits": "1 of 2 skips came after more than 4 s: r3.2 +10s after 15.7 s (tick +10s already done)",
        "replicas-stop-on-sigterm": "3 of 4 stops: r2 at +12 s: still running after 20 s; r3 at +50 s: exit -15; "
        "r1 exited by itself (exit 0), noticed at +61 s",
    }
    assert (row(verdict, "kill")["waits"], row(verdict, HEALTHY)["running"]) == (1, 1)


def test_a_slot_whose_success_came_more_than_a_period_late_is_counted_late_but_passes():
    history = clean()
    history["runs"][1] = Run(slot(1), 2, HOLDER, "succeeded", slot(1) + timedelta(seconds=PERIOD + 3))

    verdict = judge(**history)

    assert verdict.passed
    assert row(verdict, "all")["late"] == 1


def test_chance_counts_the_seconds_with_the_database_and_a_replica_up():
    start = slot(0).timestamp()
    outages = {
        "database": [(start + 2, start + 5)],
        "r1": [(start, start + PERIOD)],
        "r2": [(start + 6, start + 8)],
    }
    chance = checker.chances(outages, replicas=["r1", "r2"])

    assert chance(slot(0)) == pytest.approx(PERIOD - 3 - 2)  # database down 3 s, both replicas down 2 s
    assert chance(slot(1)) == pytest.approx(PERIOD)
    assert checker.chances(outages, replicas=["r1"])(slot(0)) == pytest.approx(0)


# --- the reminders part (tests.soak.reminders) -------------------------------------------

T = ORIGIN.timestamp()
KILLED_RUN = "vm:202:bb0202"  # a send_reminders run whose replica was SIGKILLed
KILL = reminders.Kill("r2", T + 15, frozenset({200, 202}))


def key(number: int) -> tuple[str, str]:
    return (
        f"user{number}@example.com",
        f"Reminder: Codeforces Round {number} (Div. 2) starts 2026-12-02 13:00 UTC",
    )


def mail() -> dict:
    """Four reminders due in the window: three delivered once, one uncertain after a lost reply;
    a reminders run died with the kill at +15 s."""
    states = ["delivered", "delivered", "uncertain", "delivered"]
    return {
        "reminders": [
            reminders.ReminderRow(number, key(number), slot(number), state)
            for number, state in enumerate(states)
        ],
        "copies": [
            reminders.Copy(key(number), T + 10 * number + 1, state == "delivered")
            for number, state in enumerate(states)
        ],
        "runs": [("vm:101:aa0101", "succeeded"), (KILLED_RUN, "abandoned")],
        "kills": [KILL],
    }


def judge_mail(*, record_every: int = 50, **history) -> dict[str, checker.Check]:
    found, _table = reminders.judge(last=slot(3), origin=T, record_every=record_every, **history)
    assert [check.name for check in found] == list(checker.REMINDER_CHECKS)
    return {check.name: check for check in found}


def test_a_clean_reminder_history_passes_the_reminder_checks():
    found = judge_mail(**mail())

    assert {name: check.detail for name, check in found.items()} == {
        "reminder-once": "4 messages for 4 reminders; 0 re-sends; allowed: at most 50 (RECORD_EVERY) per SIGKILL "
        "of a replica whose send_reminders run died with it, 1 such kill, so at most 50, each after its kill",
        "uncertain-not-resent": "1 message kept without a 250 (lost replies), 1 reminder uncertain, 0 of them "
        "with more than one copy (each re-send charged to a kill in reminder-once); none re-sent by itself",
        "reminders-delivered": "all 4 reminders due by the last slot settled: 3 delivered, 1 uncertain, 0 failed; "
        "0 waiting out the claim of a killed run (not due again before the end)",
    }
    assert all(check.passed for check in found.values())


def test_a_reminder_emailed_twice_is_caught_unless_a_kill_of_its_run_came_between_the_copies():
    history = mail()
    history["copies"].append(reminders.Copy(key(0), T + 45, True))  # +1 s, and again at +45 s

    assert judge_mail(**history)["reminder-once"].passed  # the kill at +15 s explains it

    history["kills"] = [reminders.Kill("r2", T + 50, KILL.pids)]  # after the second copy: explains nothing
    once = judge_mail(**history)["reminder-once"]
    assert not once.passed
    assert once.detail.startswith(
        "1 re-send no SIGKILL of a reminder holder explains: user0@example.com "
        f"({key(0)[1]}) at +1.0s and again at +45.0s; allowed:"
    )

    history["kills"] = [KILL]
    history["runs"] = [(KILLED_RUN, "succeeded")]  # its run had ended: the kill hit no reminder run
    assert "1 re-send no SIGKILL" in judge_mail(**history)["reminder-once"].detail


def test_the_reminders_table_counts_the_kills_of_reminder_runs_and_the_re_sends_charged_to_them():
    history = mail()
    history["copies"] += [reminders.Copy(key(number), T + 45, True) for number in (0, 1, 3)]
    history["kills"] = [KILL, reminders.Kill("r1", T + 30, frozenset({101}))]  # r1's run had ended

    _found, table = reminders.judge(last=slot(3), origin=T, record_every=2, **history)

    assert (table["run_kills"], table["resent"], table["charged"], table["allowed"]) == (1, 3, 2, 2)


def test_a_kill_explains_at_most_record_every_re_sends():
    history = mail()
    # Reminders 0 and 1 went out before the kill at +15 s, and again after it; 3 first went out
    # after the kill, so its second copy is never the kill's.
    history["copies"] += [reminders.Copy(key(number), T + 45, True) for number in (0, 1, 3)]

    once = judge_mail(record_every=2, **history)["reminder-once"]
    assert once.detail.startswith("1 re-send no SIGKILL of a reminder holder explains: user3@example.com")
    once = judge_mail(record_every=1, **history)["reminder-once"]
    assert once.detail.startswith("2 re-sends no SIGKILL of a reminder holder explains: user1@example.com")
    assert "at most 1 (RECORD_EVERY) per SIGKILL" in once.detail


def test_a_message_that_matches_no_reminder_fails_reminder_once():
    history = mail()
    history["copies"].append(reminders.Copy(("stranger@example.com", "Hello"), T + 5, True))

    once = judge_mail(**history)["reminder-once"]
    assert not once.passed
    assert once.detail.startswith(
        "0 re-sends no SIGKILL of a reminder holder explains, 1 message matching no reminder: "
        "stranger@example.com (Hello)"
    )


def test_a_lost_reply_must_leave_its_reminder_uncertain_and_never_be_followed_by_a_copy():
    history = mail()
    history["kills"] = []
    history["copies"].append(reminders.Copy(key(2), T + 40, True))  # re-sent after its lost reply
    history["reminders"][2] = reminders.ReminderRow(2, key(2), slot(2), "delivered")

    found = judge_mail(**history)
    assert not found["reminder-once"].passed
    assert found["uncertain-not-resent"].detail == (
        "0 reminders whose last message's reply was lost not recorded uncertain, 1 re-send after a lost reply "
        f"or of an uncertain reminder: user2@example.com ({key(2)[1]}) at +21.0s and again at +40.0s"
    )

    history = mail()
    history["reminders"][2] = reminders.ReminderRow(2, key(2), slot(2), "failed")  # unknown taken as refused
    found = judge_mail(**history)
    assert not found["uncertain-not-resent"].passed
    assert found["uncertain-not-resent"].detail.endswith(f": user2@example.com ({key(2)[1]}) is failed")


def test_a_reminder_left_pending_is_lost_unless_a_killed_runs_claim_outlasts_the_soak():
    history = mail()
    after_the_end = slot(3) + timedelta(seconds=20)
    history["reminders"][3] = reminders.ReminderRow(
        3, key(3), slot(3), "pending", after_the_end, f"{KILLED_RUN}/a1b2c3.1.1"
    )
    history["reminders"].append(reminders.ReminderRow(4, key(4), slot(3) + timedelta(seconds=1), "pending"))

    delivered = judge_mail(**history)["reminders-delivered"]
    assert delivered.passed, delivered.detail  # #3 waits out the claim; #4 is due after the last slot
    assert "; 1 waiting out the claim of a killed run" in delivered.detail

    history["reminders"][3] = reminders.ReminderRow(
        3, key(3), slot(3), "pending", after_the_end, "vm:303:cc/x.1.1"
    )
    history["reminders"][1] = reminders.ReminderRow(1, key(1), slot(1), "delivered")
    history["copies"] = [copy for copy in history["copies"] if copy.key != key(1)]
    delivered = judge_mail(**history)["reminders-delivered"]
    assert delivered.detail == (
        "1 reminder left pending past its chance, 1 reminder recorded delivered with no copy at the stand-in: "
        "#3 user3@example.com due 10:00:30: pending; #1 user1@example.com due 10:00:10: delivered"
    )
