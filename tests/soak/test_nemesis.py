"""The nemesis plan: drawn from a seed, the same every time, bounded, each kind selectable;
and the driver's answers to bad arguments (no PostgreSQL needed)."""

from __future__ import annotations

import itertools
import json
import subprocess
import sys

import pytest

from tests.conftest import ROOT, project_env
from tests.soak import failover
from tests.soak.nemesis import FAILOVER, KINDS, MAX_ACTIONS, WINDOW, plan, skew_band
from tests.soak.timing import PERIOD, TTL


def soak_cli(*args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "tests.soak", *args],
        cwd=ROOT,
        env=project_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )


def test_a_seed_gives_the_same_plan_every_time_and_another_seed_another():
    first = plan(seed=7, duration=600, kinds=KINDS, replicas=3)

    assert plan(seed=7, duration=600, kinds=KINDS, replicas=3) == first
    assert plan(seed=8, duration=600, kinds=KINDS, replicas=3) != first
    assert {action.kind for action in first} == set(KINDS)  # ten minutes draw every kind


def test_the_command_prints_the_same_plan_for_the_same_seed_whatever_the_order_of_the_kinds():
    one = soak_cli("--seed", "42", "--duration", "300", "--nemesis", "pause,kill,pg-outage", "--plan")
    two = soak_cli("--seed", "42", "--duration", "300", "--nemesis", "pg-outage,kill,pause", "--plan")

    assert (one.returncode, one.stderr) == (0, "")
    assert one.stdout == two.stdout
    actions = [json.loads(line) for line in one.stdout.splitlines()]
    assert actions and {action["kind"] for action in actions} == {"pause", "kill", "pg-outage"}
    assert [action["at"] for action in actions] == sorted(action["at"] for action in actions)


@pytest.mark.parametrize("kind", KINDS)
def test_each_kind_can_be_chosen_alone(kind):
    actions = plan(seed=3, duration=300, kinds=(kind,), replicas=3)

    assert len(actions) >= 5
    assert {action.kind for action in actions} == {kind}


def test_a_plan_is_bounded_in_time_and_count_and_each_fault_in_length():
    for seed in range(40):
        actions = plan(seed=seed, duration=900, kinds=KINDS, replicas=4)
        assert len(actions) <= MAX_ACTIONS
        assert all(0 < action.at < 900 for action in actions)
        # One after another: each next action comes at a later slot than the one before.
        assert all(later.slot > earlier.slot for earlier, later in itertools.pairwise(actions))
        for action in actions:
            assert 0 <= action.replica < 4
            assert 0 <= action.phase < PERIOD
            if action.kind == "pause":
                assert TTL < action.seconds <= TTL + 2 * PERIOD  # longer than the lease
            if action.kind in {"kill", "term", "pg-outage"}:
                assert 0 < action.seconds <= 8
            if action.kind == "skew":
                assert 0 < abs(action.offset) <= 3 * PERIOD and 2 * PERIOD <= action.seconds <= 4 * PERIOD
            if action.kind in {"pg-restart", "pg-outage"}:
                assert action.mode in {"fast", "immediate"}
            if action.kind == "commit-cut":
                assert action.mode in {"after", "before"}
    assert plan(seed=1, duration=3600, kinds=(), replicas=3) == []


def test_clock_offsets_fall_within_the_tick_window_beyond_it_and_beyond_the_period():
    offsets = [
        action.offset
        for seed in range(30)
        for action in plan(seed=seed, duration=600, kinds=("skew",), replicas=3)
    ]

    bands = {skew_band(offset) for offset in offsets}
    assert bands == {"within the tick window", "beyond the tick window", "beyond the period"}
    assert any(offset < 0 for offset in offsets) and any(offset > 0 for offset in offsets)
    assert all(abs(offset) <= WINDOW for offset in offsets if skew_band(offset) == "within the tick window")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--replicas", "0"], "soak: error: --replicas must be 1 to 8, got 0"),
        (["--duration", "3"], "soak: error: --duration must be 10 to 86400 seconds, got 3"),
        (
            ["--nemesis", "kill,flood"],
            "soak: error: --nemesis: unknown nemesis kind(s) flood; known: kill, pause, term, pg-restart, "
            "pg-outage, skew, commit-cut, smtp-lost-reply, failover, or all, or none",
        ),
        (
            ["--nemesis", "kill,failover"],
            "soak: error: --nemesis failover needs --failover sync|async (two clusters)",
        ),
        (
            ["--failover", "semi"],
            "soak: error: argument --failover: invalid choice: 'semi' (choose from 'sync', 'async')",
        ),
        (
            ["--failover", "sync", "--nemesis", "kill,pg-outage"],
            "soak: error: --failover leaves pg-restart and pg-outage out (the failover kills the primary itself)",
        ),
        (
            ["--nemesis", "kill,smtp-lost-reply"],
            "soak: error: --nemesis smtp-lost-reply needs --reminders (the SMTP stand-in)",
        ),
        (["--seed", "x"], "soak: error: argument --seed: invalid int value: 'x'"),
    ],
)
def test_a_bad_argument_is_one_line_and_exit_2(args, message):
    done = soak_cli(*args)

    assert (done.returncode, done.stdout, done.stderr) == (2, "", message + "\n")


def test_all_means_smtp_lost_reply_too_only_with_reminders():
    def kinds(*args: str) -> set[str]:
        done = soak_cli("--seed", "7", "--duration", "600", "--plan", *args)
        assert done.returncode == 0, done.stderr
        return {json.loads(line)["kind"] for line in done.stdout.splitlines()}

    assert "smtp-lost-reply" not in kinds()
    assert "smtp-lost-reply" in kinds("--reminders")
    # Without it the plan is the one the seed drew before the kind existed.
    assert kinds() == {action.kind for action in plan(seed=7, duration=600, kinds=KINDS[:-1], replicas=3)}


def test_without_postgresql_it_says_how_to_run_it_and_exits_2():
    done = soak_cli("--seed", "1", DATABASE_URL="sqlite:///soak.sqlite3")

    assert done.returncode == 2, done.stderr
    assert done.stderr == (
        "soak: error: the soak needs PostgreSQL (it restarts and stops the server): run it under "
        "scripts/with-postgres.sh (DATABASE_URL is 'sqlite:///soak.sqlite3')\n"
    )


def test_catch_up_puts_the_key_into_the_soak_jobs_entry_and_nothing_else_changes():
    show = "import json; from django.conf import settings; print(json.dumps(settings.LOCKS_JOBS['soak']))"

    def entry(**env: str) -> dict:
        done = subprocess.run(
            [sys.executable, "-c", f"import django; django.setup(); {show}"],
            cwd=ROOT,
            env=project_env(DJANGO_SETTINGS_MODULE="tests.soak.settings", **env),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        return json.loads(done.stdout)

    plain = entry()
    assert "catch_up" not in plain
    assert plain["schedule"] == "* * * * * */10" and plain["ttl"] == TTL
    assert entry(SOAK_CATCH_UP="all") == {**plain, "catch_up": "all"}


def test_with_reminders_a_third_of_the_kills_aim_at_a_reminders_run_and_nothing_else_changes():
    kills = ("kill",)
    for seed in range(20):
        plain = plan(seed=seed, duration=600, kinds=KINDS, replicas=3)
        mixed = plan(seed=seed, duration=600, kinds=KINDS, replicas=3, reminders=True)
        assert not any(action.reminders for action in plain)
        assert "reminders" not in plain[0].as_json()  # a plan without it reads as before
        # The other kinds and the kills' own draws are the seed's; only the aimed kills move,
        # to half a second before their next slot (where the reminders run begins).
        common = min(len(plain), len(mixed))  # an aimed kill ends later: the plan may end sooner
        drawn = [
            [(a.kind, a.replica, a.seconds, a.mode, a.offset) for a in p[:common]] for p in (plain, mixed)
        ]
        assert drawn[0] == drawn[1]
        for action in mixed:
            if action.reminders:
                assert action.kind == "kill" and action.phase == PERIOD - 0.5
                assert 1 <= action.messages <= 8
                assert action.describe().startswith(
                    f"SIGKILL the replica sending reminders after {action.messages} of its run's messages (else "
                )
    aimed = [
        action.reminders
        for seed in range(40)
        for action in plan(seed=seed, duration=600, kinds=kills, replicas=3, reminders=True)
    ]
    assert 0.2 < sum(aimed) / len(aimed) < 0.45, sum(aimed) / len(aimed)


@pytest.mark.parametrize("mode", ["sync", "async"])
def test_with_failover_a_failover_comes_at_its_own_cadence_and_the_server_kinds_are_left_out(mode):
    done = soak_cli("--seed", "4242", "--duration", "600", "--reminders", "--failover", mode, "--plan")
    assert done.returncode == 0, done.stderr
    actions = [json.loads(line) for line in done.stdout.splitlines()]
    kinds = {action["kind"] for action in actions}
    assert FAILOVER in kinds and not kinds & {"pg-restart", "pg-outage"}
    assert len(kinds) > 2  # the other kinds fill the time between
    moments = [action["at"] for action in actions if action["kind"] == FAILOVER]
    # At least one per failover.SECONDS_PER_FAILOVER, with time to spare for actions that come late.
    assert len(moments) >= 600 // failover.SECONDS_PER_FAILOVER + 1, moments
    assert moments[0] <= failover.FIRST * PERIOD + 4 * PERIOD
    assert all(b - a <= failover.EVERY + 6 * PERIOD for a, b in itertools.pairwise(moments)), moments
    for action in actions:
        if action["kind"] == FAILOVER and mode == "async":
            # From a second before a slot, for longer than the next run's commit (1.5 s after it).
            assert action["phase"] == PERIOD - 1 and 4 <= action["seconds"] <= 14
            assert action["describe"].startswith(f"freeze the replication link for {action['seconds']:g} s")
        elif action["kind"] == FAILOVER:
            assert action["seconds"] == 0 and 0 < action["phase"] < PERIOD / 2  # in the middle of a run


def test_without_failover_no_plan_has_one_and_the_others_stay_what_the_seed_drew():
    for seed in range(10):
        plain = plan(seed=seed, duration=600, kinds=KINDS, replicas=3)
        assert plan(seed=seed, duration=600, kinds=(*KINDS, FAILOVER), replicas=3) == plain
        assert FAILOVER not in {action.kind for action in plain}
    assert plan(seed=1, duration=600, kinds=(FAILOVER,), replicas=3) == []
    only = plan(seed=1, duration=600, kinds=(FAILOVER,), replicas=3, failover="sync")
    assert len(only) >= 5 and {action.kind for action in only} == {FAILOVER}


@pytest.mark.parametrize(
    ("nemesis", "kinds"), [("all", ("kill", "pause", "term")), ("kill,term", ("kill", "term"))]
)
def test_a_soak_on_mongodb_takes_the_replicas_faults_only(nemesis, kinds):
    from tests.soak.driver import parse

    assert parse(["--db", "mongodb", "--nemesis", nemesis]).kinds == kinds


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--nemesis", "pg-restart"], "--db mongodb: the nemesis is kill, pause, term (or a part of them)"),
        (["--reminders"], "--db mongodb runs the soak job only: no --failover, no --reminders"),
    ],
)
def test_a_soak_on_mongodb_refuses_what_it_cannot_do(argv, message):
    from tests.soak.driver import SoakError, parse

    with pytest.raises(SoakError) as refused:
        parse(["--db", "mongodb", *argv])
    assert str(refused.value) == message
