"""The tick row (issue 36): one row per (job, tick), the database's unique key deciding which copy
of ``run_scheduler`` asks for a tick, and a losing copy paying one statement a wake.

Real database (SQLite, PostgreSQL, MongoDB in tests/test_mongodb.py), autocommit as in production.
"""

from __future__ import annotations

import logging
import subprocess
import sys
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest
from django.db import IntegrityError, connection, transaction
from django.db.models.functions import Now
from django.test.utils import CaptureQueriesContext

from locks.lease import Grant, Skip, acquire, release
from locks.models import JobRun, SyncLock, Tick
from locks.operator import force_release, reset_tick
from locks.registry import Job, jobs
from locks.runner import RunResult, prune_runs, run_job, run_locked
from locks.schedule import Schedule
from locks.scheduler import Scheduler
from locks.status import job_ledgers
from tests.conftest import ROOT, project_env, spawn
from tests.hostproject.settings import RECORD
from tests.jobsapp.models import SlotWrite
from tests.locks.conftest import faketime_or_skip, offset_to, register, wait_for
from tests.locks.test_scheduler import HOURLY, FakeClock, Runs
from tests.locks.test_scheduler_pool import EACH_EXECUTOR, slow_write_env
from tests.locks.test_scheduler_processes import start as start_scheduler

pytestmark = pytest.mark.django_db(transaction=True)

TICK = datetime(2030, 1, 1, 14, tzinfo=UTC)
MINUTE = timedelta(minutes=1)


def test_the_unique_key_refuses_a_second_row_of_a_tick():
    """Even application code that skips the claim cannot store a tick twice."""
    Tick.objects.create(job_name="sync", tick=TICK, holder="a:1:aaaaaa")
    with pytest.raises(IntegrityError), transaction.atomic():
        Tick.objects.create(job_name="sync", tick=TICK, holder="b:2:bbbbbb")
    Tick.objects.create(job_name="sync", tick=TICK + timedelta(hours=1), holder="b:2:bbbbbb")
    Tick.objects.create(job_name="other", tick=TICK, holder="b:2:bbbbbb")

    assert Tick.objects.filter(job_name="sync", tick=TICK).get().holder == "a:1:aaaaaa"
    assert Tick.objects.count() == 3


def test_a_hundred_ticks_are_claimed_in_one_statement_and_a_loser_pays_one():
    asks = [(f"job_{number}", TICK, MINUTE) for number in range(100)]

    won, statements = {}, {}
    for holder in ("a:1:aaaaaa", "b:2:bbbbbb", "c:3:cccccc"):
        with CaptureQueriesContext(connection) as claiming:
            won[holder] = Tick.objects.claim(asks, holder=holder)
        statements[holder] = len(claiming)

    assert won == {
        "a:1:aaaaaa": {name for name, _tick, _ttl in asks},
        "b:2:bbbbbb": set(),
        "c:3:cccccc": set(),
    }
    assert statements == {"a:1:aaaaaa": 1, "b:2:bbbbbb": 1, "c:3:cccccc": 1}
    assert set(Tick.objects.values_list("holder", "claims", "status")) == {("a:1:aaaaaa", 1, "claimed")}


def test_a_claim_is_won_again_by_its_holder_and_by_anyone_once_it_ended():
    """Its holder asking again (the answer to its claim was lost) wins it again; another copy wins
    it only once the claim has ended (the claimant died: its lease's TTL)."""
    assert Tick.objects.claim([("sync", TICK, MINUTE)], holder="a:1:aaaaaa") == {"sync"}
    assert Tick.objects.claim([("sync", TICK, MINUTE)], holder="a:1:aaaaaa") == {"sync"}
    assert Tick.objects.claim([("sync", TICK, MINUTE)], holder="b:2:bbbbbb") == set()
    Tick.objects.update(until=Tick.objects.get().until - 2 * MINUTE)  # the claim has ended

    assert Tick.objects.claim([("sync", TICK, MINUTE)], holder="b:2:bbbbbb") == {"sync"}
    row = Tick.objects.get()
    assert (row.holder, row.claims, row.status) == ("b:2:bbbbbb", 3, "claimed")


def test_a_closed_tick_is_claimed_by_no_other_copy_an_open_one_by_any():
    Tick.objects.claim([("done", TICK, MINUTE), ("retry", TICK, MINUTE)], holder="a:1:aaaaaa")
    Tick.objects.close([("done", TICK, "succeeded", False)], holder="a:1:aaaaaa")
    Tick.objects.close([("retry", TICK, "failed", True)], holder="a:1:aaaaaa")
    assert Tick.objects.close([("retry", TICK, "succeeded", False)], holder="z:9:zzzzzz") == 0

    won = Tick.objects.claim([("done", TICK, MINUTE), ("retry", TICK, MINUTE)], holder="b:2:bbbbbb")

    assert won == {"retry"}
    assert dict(Tick.objects.values_list("job_name", "status")) == {"done": "succeeded", "retry": "claimed"}
    assert Tick.objects.get(job_name="done").until is None


def test_a_tick_closed_for_good_is_won_by_no_copy_its_own_holder_neither():
    """The model of the lease found it (tests/locks/test_model.py): a copy that asks again for a tick
    it closed for good (its clock stepped back, then on) won it again, and its row said ``claimed``."""
    Tick.objects.claim([("done", TICK, MINUTE), ("retry", TICK, MINUTE)], holder="a:1:aaaaaa")
    Tick.objects.close(
        [("done", TICK, "succeeded", False), ("retry", TICK, "failed", True)], holder="a:1:aaaaaa"
    )

    won = Tick.objects.claim([("done", TICK, MINUTE), ("retry", TICK, MINUTE)], holder="a:1:aaaaaa")

    assert won == {"retry"}
    assert Tick.objects.values_list("status", "until", "claims").get(job_name="done") == (
        "succeeded",
        None,
        1,
    )


def replicas(clock: FakeClock, jobs, count: int = 3) -> list[tuple[Scheduler, Runs]]:
    made = []
    for _ in range(count):
        runs = Runs(clock)
        made.append((Scheduler(jobs=jobs, now=clock.now, run=runs, claim=True), runs))
    return made


def statements_of_a_wake(copies: list[Scheduler]) -> list[int]:
    """The statements each copy sends in one wake, in turn (counted as sent: the loop resets
    connection.queries, as a request's end does)."""
    counts = []
    for scheduler in copies:
        sent = []

        def count(execute, sql, params, many, context, sent=sent):
            sent.append(sql)
            return execute(sql, params, many, context)

        with connection.execute_wrapper(count):
            scheduler.step()
        counts.append(len(sent))
    return counts


def test_one_wake_of_three_replicas_asks_for_each_of_a_hundred_due_ticks_once():
    """Claim before spawn: the winner of the one claim asks for its ticks (a fork each under
    run_scheduler) and closes each after; each losing replica sends one statement and asks nothing."""
    clock = FakeClock(TICK)
    jobs = [replace(HOURLY, name=f"hourly_{number}") for number in range(100)]
    copies = replicas(clock, jobs)

    statements = statements_of_a_wake([scheduler for scheduler, _runs in copies])

    assert [len(runs.asked) for _scheduler, runs in copies] == [100, 0, 0]
    assert statements == [2, 1, 1]  # the claim, then the claims closed
    assert Tick.objects.filter(status="succeeded", until__isnull=True).count() == 100


def test_a_wake_of_three_replicas_runs_a_hundred_no_op_slots_in_four_statements_each(settings):
    """Issue 36's count, the runs included (in this process, as a pool's worker runs them): the
    winner's claim, then each won slot's lease (its compare-and-set returning the row it wrote),
    its start record, its release and its outcome, then its claims closed in one statement; each
    loser one statement."""
    every_minute = {"callable": "tests.jobsapp.jobs.record", "ttl": 60, "schedule": "* * * * *"}
    names = [f"minutely_{number}" for number in range(100)]
    register(settings, **dict.fromkeys(names, every_minute))
    jobs = [replace(HOURLY, name=name, cron=Schedule("* * * * *")) for name in names]

    def run(*, name: str, due: datetime) -> RunResult:
        return run_locked(job=name, tick=due, ttl=MINUTE, fn=lambda lease: None)

    clock = FakeClock(TICK - MINUTE)
    copies = [Scheduler(jobs=jobs, now=clock.now, run=run, claim=True) for _ in range(3)]
    for scheduler in copies:  # the slot before: the lock rows made and stamped, a run each
        scheduler.step()
    clock.at = TICK

    statements = statements_of_a_wake(copies)

    assert statements == [2 + 100 * 4, 1, 1], statements
    assert JobRun.objects.filter(tick=TICK, status="succeeded").count() == 100
    assert Tick.objects.filter(tick=TICK, status="succeeded", until__isnull=True).count() == 100


def test_a_tick_the_winner_asks_again_for_is_open_to_every_copy():
    """A failed attempt with a retry left: its claim ends at once, so any copy may ask for it (the
    lease row keeps the attempts and the retry time, and answers a copy that asks too early)."""
    clock = FakeClock(TICK)
    failed = RunResult(job="hourly", tick=TICK, holder="h", outcome="failed", grant=Grant(retry_delay=MINUTE))
    (first, first_runs), (second, second_runs) = replicas(clock, [HOURLY], count=2)
    first_runs.outcomes = [failed]
    first.step()
    assert Tick.objects.values_list("status", "claims").get() == ("failed", 1)

    second.step()

    assert [tick for _when, tick in second_runs.asked] == [TICK]
    assert Tick.objects.values_list("holder", "status", "claims").get() == (second.holder, "succeeded", 2)


def test_a_loser_looks_again_after_the_claims_ttl_and_takes_a_dead_winners_tick():
    clock = FakeClock(TICK)
    (dead, dead_runs), (alive, alive_runs) = replicas(clock, [HOURLY], count=2)
    Tick.objects.claim([("hourly", TICK, HOURLY.ttl)], holder=dead.holder)  # claimed, then died
    alive.step()
    assert alive_runs.asked == []

    Tick.objects.update(until=Tick.objects.get().until - HOURLY.ttl - MINUTE)  # the database's clock moved on
    clock.at += HOURLY.ttl + timedelta(seconds=1)
    alive.step()

    assert [tick for _when, tick in alive_runs.asked] == [TICK] and dead_runs.asked == []
    assert Tick.objects.values_list("holder", "status").get() == (alive.holder, "succeeded")


def test_a_loser_that_looks_again_within_the_slot_says_claimed_by_another_copy_once(caplog):
    """A losing copy asks again after the first retry delay, one statement each time (a crontab
    winner may have failed), and logs the refusal at INFO for the tick's first ask only."""
    clock = FakeClock(TICK)
    ((loser, runs),) = replicas(clock, [HOURLY], count=1)
    held = [("hourly", tick, timedelta(hours=3)) for tick in (TICK, TICK + timedelta(hours=1))]
    Tick.objects.claim(held, holder="other:1:aaaaaa")  # held for the whole of both slots
    statements = []
    with caplog.at_level(logging.DEBUG, logger="locks.scheduler"):
        for _ in range(3):
            statements += statements_of_a_wake([loser])
            clock.at = loser.plans[0].again_at
        clock.at = TICK + timedelta(hours=1)
        statements += statements_of_a_wake([loser])

    refused = [r for r in caplog.records if "reason=claimed by another copy" in r.getMessage()]
    assert [(r.levelname, TICK.isoformat() in r.getMessage()) for r in refused] == [
        ("INFO", True),
        ("DEBUG", True),
        ("DEBUG", True),
        ("INFO", False),  # the next slot's first refusal
    ]
    assert statements == [1, 1, 1, 1] and runs.asked == []


def test_a_job_named_twice_is_one_plan_whose_tick_is_claimed_and_asked_for_once():
    """``run_scheduler a a``: on PostgreSQL one INSERT … ON CONFLICT cannot touch a row twice, so a job
    named twice made every wake's claim fail and each due job was asked for unclaimed (found by a helper)."""
    clock = FakeClock(TICK)
    runs = Runs(clock)
    scheduler = Scheduler(jobs=[HOURLY, HOURLY], now=clock.now, run=runs, claim=True)

    scheduler.step()

    assert len(scheduler.plans) == 1 and [tick for _when, tick in runs.asked] == [TICK]
    assert Tick.objects.values_list("holder", "status").get() == (scheduler.holder, "succeeded")


def test_a_tick_done_by_a_run_that_outlived_its_claim_reads_succeeded():
    """The first copy's run outlived its claim: a second copy claimed the tick and was told the lease
    is held (open again), then that the tick is done: the row says succeeded, not why it was told so."""
    clock = FakeClock(TICK)
    ((second, second_runs),) = replicas(clock, [HOURLY], count=1)
    Tick.objects.claim([("hourly", TICK, HOURLY.ttl)], holder="first:1:aaaaaa")
    Tick.objects.update(until=Tick.objects.get().until - HOURLY.ttl - MINUTE)  # its claim ended
    done = Skip("hourly", TICK, "tick_claimed", "first:1:aaaaaa", None, TICK)
    second_runs.outcomes = [RunResult(job="hourly", tick=TICK, holder=second.holder, skip=done)]

    second.step()

    assert [tick for _when, tick in second_runs.asked] == [TICK]
    assert Tick.objects.values_list("holder", "status", "until").get() == (second.holder, "succeeded", None)


def test_without_the_tick_table_every_due_tick_is_asked_for(caplog):
    """A copy of this release started before ``migrate``: the claim cannot be made, the lease decides."""
    clock = FakeClock(TICK)
    ((scheduler, runs),) = replicas(clock, [HOURLY], count=1)
    with connection.schema_editor() as editor:
        editor.delete_model(Tick)
    try:
        scheduler.step()
    finally:
        with connection.schema_editor() as editor:
            editor.create_model(Tick)

    assert [tick for _when, tick in runs.asked] == [TICK]
    assert "the due ticks were not claimed" in caplog.text


def test_old_tick_rows_are_pruned_with_the_runs_but_never_a_registered_jobs_latest(settings):
    """A job removed from LOCKS_JOBS ("gone", its lock row kept) loses its latest too: no copy asks for
    its ticks again."""
    settings.LOCKS_RUN_RETENTION_DAYS = 30
    SyncLock.objects.create(job_name="gone")  # the prune finds the removed jobs by their lock rows
    old, older = (datetime(2020, 1, day, tzinfo=UTC) for day in (2, 1))
    Tick.objects.claim([("record", older, MINUTE), ("gone", older, MINUTE)], holder="a:1:aaaaaa")
    Tick.objects.claim(
        [("record", old, MINUTE), ("record", TICK, MINUTE), ("refuse", old, MINUTE), ("gone", old, MINUTE)],
        holder="a:1:aaaaaa",
    )

    prune_runs(job="record")
    prune_runs(job="refuse")

    assert sorted(Tick.objects.values_list("job_name", "tick")) == [("record", TICK), ("refuse", old)]


def test_the_admin_lists_the_claimed_ticks_read_only(admin_client):
    Tick.objects.claim([("sync", TICK, MINUTE), ("mail", TICK, MINUTE)], holder="a:1:aaaaaa")
    Tick.objects.close([("sync", TICK, "succeeded", False)], holder="a:1:aaaaaa")
    Tick.objects.close([("mail", TICK, "held", True)], holder="a:1:aaaaaa")

    listing = admin_client.get("/admin/locks/tick/")
    detail = admin_client.get(f"/admin/locks/tick/{Tick.objects.get(job_name='sync').pk}/change/")

    assert listing.status_code == detail.status_code == 200
    rows = {row.job_name: row.status for row in listing.context["cl"].result_list}
    assert rows == {"sync": "succeeded", "mail": "held"}
    page = listing.content.decode()
    assert (
        'data-kind="succeeded"' in page and 'data-kind="held"' in page and "2030-01-01 08:00:00 CST" in page
    )  # TIME_ZONE
    assert "Add claimed tick" not in page and 'name="_save"' not in detail.content.decode()
    assert (
        admin_client.post(f"/admin/locks/tick/{Tick.objects.get(job_name='sync').pk}/delete/").status_code
        == 403
    )


def test_a_catch_up_run_of_an_earlier_slot_leaves_the_tick_asked_for_open():
    """catch_up "all": the ask for the due tick ran an older slot, with more behind it."""
    clock = FakeClock(TICK)
    ((scheduler, runs),) = replicas(clock, [HOURLY], count=1)
    earlier = RunResult(job="hourly", tick=TICK - timedelta(hours=3), holder="h", outcome="succeeded")
    runs.outcomes = [replace(earlier, claimed="behind"), replace(earlier, tick=TICK)]
    scheduler.step()
    assert Tick.objects.values_list("status", "claims").get()[0] == "succeeded"
    assert Tick.objects.get().until is not None  # open: another copy may go on catching up

    scheduler.step()  # asked again at once, for the same tick: this time its own slot ran

    assert [tick for _when, tick in runs.asked] == [TICK, TICK]
    assert Tick.objects.values_list("status", "claims", "until").get() == ("succeeded", 2, None)


def cron_pass(db_url: str, tmp_path, *jobs: str, **variables: str) -> tuple[dict[str, str], list[str]]:
    """The environment and the ``python`` arguments of the crontab line's pass over ``jobs`` alone (their
    runs' logs in tmp_path/log)."""
    (tmp_path / "log").mkdir()
    env = project_env(
        DATABASE_URL=db_url,
        HOSTPROJECT_VAR=str(tmp_path),
        HOSTPROJECT_JOBS=" ".join(jobs),
        HOSTPROJECT_CHECK_JOBS="0",
        DJANGO_SETTINGS_MODULE="tests.hostproject.settings",
        **variables,
    )
    code = "import django; django.setup(); from locks.crontab import run_due; run_due(*%r, log_dir=%r)"
    return env, ["-c", code % (jobs, str(tmp_path / "log"))]


def refuse_every_minute(settings, **entry) -> Job:
    """The job "refuse" every minute on a 120 s lease, as send_reminders (``entry``: more of its entry),
    at a moment well before the next slot's window: a crontab pass names the slot of now."""
    now = datetime.now(UTC)
    if now.second > 20:
        time.sleep(61 - now.second)
    register(settings, refuse={**settings.LOCKS_JOBS["refuse"], "schedule": "* * * * *", "ttl": 120, **entry})
    return jobs()["refuse"]


# The pass's variables for refuse_every_minute.
REFUSE_EVERY_MINUTE = {"REFUSE_SCHEDULE": "* * * * *", "REFUSE_TTL": "120"}


def test_two_cron_passes_of_one_minute_fork_one_run_between_them(db_url, tmp_path):
    """The crontab line's pass on two hosts at the same minute: the first claims the due slot and
    forks its run; the second sends one statement, says why in one line, and forks nothing."""
    faketime_or_skip()
    env, code = cron_pass(db_url, tmp_path, "record")
    slot = Schedule("*/5 * * * *").slot_at_or_before(datetime.now(UTC)) - timedelta(minutes=5)  # its schedule
    passes = [
        subprocess.run(
            ["faketime", "-f", offset_to(slot + timedelta(seconds=seconds)), sys.executable, *code],
            cwd=ROOT,
            env=env,
            capture_output=True,
            text=True,
            timeout=120,
        )
        for seconds in (1, 2)
    ]

    assert [ran.returncode for ran in passes] == [0, 0], [ran.stderr for ran in passes]
    assert "claimed by another copy" not in passes[0].stdout
    assert f"job=record tick={slot.isoformat()} " in passes[1].stdout, passes[1].stdout
    assert "outcome=skipped reason=claimed by another copy" in passes[1].stdout
    assert JobRun.objects.filter(job_name="record", tick=slot).count() == 1
    log = (tmp_path / "log" / "record.log").read_text()
    assert log.count("outcome=") == 1, log  # one run forked, by the first pass
    assert Tick.objects.values_list("job_name", "tick", "status").get() == ("record", slot, "asked")


def test_a_cron_pass_late_in_a_minute_runs_the_slot_it_claimed_not_the_next(db_url, tmp_path):
    """A pass that cron starts 50 s into a minute claims that minute's slot of a job every minute (the
    latest slot within the pass); the slot of now for a run at that moment is the next one (it is
    within a quarter of the period). Its run claimed the next slot before, 10 s before its time: the
    claimed slot never ran, and the next minute's pass found its own slot done."""
    faketime_or_skip()
    env, code = cron_pass(db_url, tmp_path, "write_slot", WRITE_SLOT_SCHEDULE="* * * * *")
    slot = Schedule("* * * * *").slot_at_or_before(datetime.now(UTC)) - 10 * MINUTE
    late = ["faketime", "-f", offset_to(slot + timedelta(seconds=50)), sys.executable, *code]
    ran = subprocess.run(late, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)

    assert ran.returncode == 0, ran.stderr
    assert Tick.objects.values_list("job_name", "tick").get() == ("write_slot", slot)
    assert list(JobRun.objects.values_list("tick", "status", "requested_by")) == [(slot, "succeeded", "cron")]
    assert list(SlotWrite.objects.values_list("tick", flat=True)) == [slot]


# The pass of ``cron_pass`` on a host at its pid limit for its first fork (EAGAIN), not for the others.
FIRST_FORK_FAILS = """
import errno, os
real_fork, forks = os.fork, []
def fork():
    forks.append(1)
    if len(forks) == 1:
        raise BlockingIOError(errno.EAGAIN, "Resource temporarily unavailable")
    return real_fork()
os.fork = fork
"""


def test_a_cron_pass_whose_fork_fails_says_so_ends_that_claim_and_starts_the_other_runs(db_url, tmp_path):
    """A pass at the host's pid limit (or out of memory) for one job's run: that job's one line says it
    broke and why, its claim ends at once (for a scheduler beside the pass to ask), the other due job
    still runs, and the pass exits 1. The OSError ended the pass with a traceback before, the claim of
    every job it had won standing for its TTL and the jobs after it in the line never started."""
    faketime_or_skip()
    env, code = cron_pass(db_url, tmp_path, "record", "write_slot")
    slot = Schedule("*/5 * * * *").slot_at_or_before(datetime.now(UTC)) - timedelta(minutes=5)
    code[1] = FIRST_FORK_FAILS + code[1].replace("; ", "\n")
    at_slot = ["faketime", "-f", offset_to(slot + timedelta(seconds=1)), sys.executable, *code]
    ran = subprocess.run(at_slot, cwd=ROOT, env=env, capture_output=True, text=True, timeout=120)

    assert ran.returncode == 1, ran.stderr
    assert "Traceback" not in ran.stderr + ran.stdout, ran.stderr
    [line] = ran.stdout.splitlines()
    assert line.startswith(f"job=record tick={slot.isoformat()} holder="), line
    assert line.endswith(
        " outcome=broke error=no process could be started for its run "
        "(BlockingIOError: [Errno 11] Resource temporarily unavailable)"
    ), line
    claims = dict(Tick.objects.filter(tick=slot).values_list("job_name", "status"))
    assert claims == {"record": "broke", "write_slot": "asked"}
    ended = Tick.objects.values_list("until", flat=True)
    assert ended.get(job_name="record") < ended.get(job_name="write_slot")  # at once, not the TTL's end
    assert list(JobRun.objects.values_list("job_name", "tick", "status")) == [
        ("write_slot", slot, "succeeded")
    ]
    assert not (tmp_path / "log" / "record.log").exists()


# --- the tick row against the lease row (real runs under the lease, a fake clock for the loop) --------

HOUR = timedelta(hours=1)


def force_released_on_its_first_attempt(lease) -> dict:
    """A job that writes nothing (no fenced block): on its first attempt an operator force-releases its
    lease while it runs (``locks release JOB --token N``), and it ends before anything tells it."""
    if lease.grant.attempt == 1:
        assert force_release(job=lease.job, expected_token=lease.token, by="cli:ops").changed
    return {"ran": 1}


def the_slot_of_now() -> datetime:
    """The hourly slot of now on the real clock, with at least 30 s of its hour to go: the lease refuses
    the scheduler's slot ahead of the database clock, and the ledger judges its chance on that clock."""
    now = datetime.now(UTC)
    if (left := (Schedule("0 * * * *").next_slot(now) - now).total_seconds()) < 30:
        time.sleep(left + 1)
    return Schedule("0 * * * *").slot_at_or_before(datetime.now(UTC))


def ledger_of(job: Job, tick: datetime) -> tuple[str, int]:
    """What ``locks ticks``, /metrics and check_jobs say of ``tick``: its outcome and attempts."""
    slot = next(slot for slot in job_ledgers(jobs=[job])[job.name].slots if slot.tick == tick)
    return slot.outcome, slot.attempts


def test_a_force_released_attempt_leaves_the_slot_to_be_asked_for_again_while_it_has_attempts(settings):
    """Rule 3: a force-released tick stays not done, and a later scheduled run that names it claims
    it again while it has attempts left. Its run wrote nothing, so it learns of the release only as it
    releases: ``runner._release`` records ``lost_lock`` with no delay before the next attempt (its release
    set none), which the scheduler asks for at once. Its retry delay was None before (what
    ``Scheduler._delay`` reads as "the last attempt"): the tick row closed for good, and no copy asked
    for the slot again while the lease row would run its second attempt."""
    job = {"schedule": "0 * * * *", "ttl": 60, "retry": {"delays": [60, 300]}}
    register(settings, released={**job, "callable": f"{__name__}.force_released_on_its_first_attempt"})
    released, slot = jobs()["released"], the_slot_of_now()
    clock = FakeClock(slot + timedelta(seconds=5))
    first, second = (Scheduler(jobs=[released], now=clock.now, claim=True) for _ in range(2))
    first.step()
    row = SyncLock.objects.get(job_name="released")
    assert (row.tick, row.tick_done, row.tick_attempts, row.retry_at, row.locked_until) == (
        slot,
        False,
        1,
        None,
        None,
    )  # the lease row: the slot's second attempt may start now
    assert ledger_of(released, slot) == ("pending", 1)

    for minutes in (0, 2, 10, 30):  # within the slot's chance: the copies, and one started afresh
        clock.at = slot + timedelta(minutes=minutes, seconds=5)
        for scheduler in (second, first, Scheduler(jobs=[released], now=clock.now, claim=True)):
            scheduler.step()

    attempts = JobRun.objects.filter(job_name="released", tick=slot).order_by("attempt")
    assert list(attempts.values_list("attempt", "status")) == [(1, "lost_lock"), (2, "succeeded")]
    assert Tick.objects.values_list("status", "until").get() == ("succeeded", None)


def blocked_by_a_far_tick(settings, *, slot: datetime, catch_up: str = "latest") -> tuple:
    """An hourly job whose slot before ``slot`` succeeded, then a tick far ahead claimed (a caller of
    run_locked with no horizon), so the scheduler's ask for ``slot`` was told so and ended its claim, open
    (it closed it for good before); then the operator reset the far tick. The job, the scheduler's clock,
    the scheduler."""
    register(settings, blocked={**RECORD, "schedule": "0 * * * *", "catch_up": catch_up})
    blocked, far = jobs()["blocked"], slot + 400 * 24 * HOUR
    clock = FakeClock(slot - HOUR + timedelta(seconds=5))
    scheduler = Scheduler(jobs=[blocked], now=clock.now, claim=True)
    scheduler.step()  # the slot before: it succeeds
    assert run_locked("blocked", far, blocked.ttl, lambda lease: None).outcome == "succeeded"
    clock.at = slot + timedelta(seconds=5)
    scheduler.step()
    status, until = Tick.objects.values_list("status", "until").get(tick=slot)
    assert (status, until is None) == ("tick_claimed", False)
    assert reset_tick(job="blocked", expected_tick=far, by="cli:ops").changed
    return blocked, clock, scheduler


def test_a_slot_an_operators_reset_reopened_is_run_by_a_scheduler_started_within_its_chance(settings):
    """Rule 9's case for a reset: a tick far ahead (a caller of run_locked with no horizon) blocks the
    real ones, so the scheduler's ask for the slot of now is told "a later tick was claimed" (it closed
    its tick row for good before; now it ends its claim, open). The operator resets the far tick: the lease row goes back to the last slot
    that succeeded, and would run the slot of now (``locks ticks`` calls it pending); the reset reopens
    the slot's tick row too ("reset"), so a copy started afresh within the slot's chance (the scheduler
    restarted once the tick is reset: "on start, ... a slot nobody ran ... is caught up") runs it. The
    row stayed closed for good before: that copy logged "claimed by another copy"."""
    slot = the_slot_of_now()
    blocked, clock, _first = blocked_by_a_far_tick(settings, slot=slot)

    assert SyncLock.objects.values_list("tick", "tick_done").get(job_name="blocked") == (slot - HOUR, True)
    assert ledger_of(blocked, slot) == ("pending", 0)
    assert Tick.objects.filter(tick=slot, status="reset", until__isnull=False).exists()  # asked for again
    clock.at = slot + timedelta(minutes=10)
    Scheduler(jobs=[blocked], now=clock.now, claim=True).step()  # restarted

    assert JobRun.objects.filter(job_name="blocked", tick=slot, status="succeeded").count() == 1
    assert Tick.objects.values_list("status", "until").get(tick=slot) == ("succeeded", None)


def test_a_reset_that_lands_while_an_ask_is_answered_still_reopens_the_slot(settings):
    """The reset of ``test_a_slot_an_operators_reset_reopened_is_run_by_a_scheduler_started_...``, but the
    operator's click lands while the ask for the slot is on its way back: the lease row has told the run
    "a later tick was claimed", and the reset gives the slot back before the copy closes its claim. The
    copy closed it for good from that answer before, so a copy started afresh within the slot's chance was
    told "claimed by another copy" while the lease row would run the slot; a later tick claimed now
    leaves the claim open."""
    slot = the_slot_of_now()
    register(settings, blocked={**RECORD, "schedule": "0 * * * *"})
    blocked, far = jobs()["blocked"], slot + 400 * 24 * HOUR

    def run(*, name: str, due: datetime) -> RunResult:
        result = run_job(name=name, due=due)
        if due == slot:  # the operator's reset, before the answer reaches the scheduler
            assert reset_tick(job="blocked", expected_tick=far, by="cli:ops").changed
        return result

    clock = FakeClock(slot - HOUR + timedelta(seconds=5))
    scheduler = Scheduler(jobs=[blocked], now=clock.now, run=run, claim=True)
    scheduler.step()  # the slot before: it succeeds
    assert run_locked("blocked", far, blocked.ttl, lambda lease: None).outcome == "succeeded"
    clock.at = slot + timedelta(seconds=5)
    scheduler.step()
    assert ledger_of(blocked, slot) == ("pending", 0)  # the lease row gives the slot back
    clock.at = slot + timedelta(minutes=10)
    Scheduler(jobs=[blocked], now=clock.now, claim=True).step()  # restarted within the slot's chance

    assert JobRun.objects.filter(job_name="blocked", tick=slot, status="succeeded").count() == 1


def test_a_slot_an_operators_reset_reopened_is_run_by_the_scheduler_running_beside_it(settings):
    """The reset of ``test_a_slot_an_operators_reset_reopened_is_run_by_a_scheduler_started_...``, with
    no restart: the copies of run_scheduler go on running, as they do in production. The lease row would
    run the slot (the ledger says pending) and its tick row reads "reset", open to every copy ("so a copy
    asks for them again", docs/architecture.md). The copy that was told "a later tick was claimed" looks
    again within the slot's chance (after the first retry delay) and runs it; it closed its plan for the
    slot before (no time to ask again), and the slot passed unasked: the ledger called it missed."""
    slot = the_slot_of_now()
    blocked, clock, scheduler = blocked_by_a_far_tick(settings, slot=slot)
    assert ledger_of(blocked, slot) == ("pending", 0)
    clock.end, scheduler.stop = slot + HOUR - timedelta(seconds=1), clock.stop

    scheduler.run_forever(wait=clock.wait)  # the rest of the slot's chance

    assert JobRun.objects.filter(job_name="blocked", tick=slot, status="succeeded").count() == 1


def outlives_its_claim(admin_client, seen: dict):
    """A run longer than its TTL (its heartbeat renews the lease), which reads the admin's list of
    claimed ticks while it goes on."""

    def body(lease) -> dict:
        time.sleep(2.5)  # the claim's ``until`` (its TTL, 1 s) has passed; the lease is renewed
        lease.check()  # still this run's
        seen["page"] = admin_client.get("/admin/locks/tick/").content.decode()
        return {"ran": 1}

    return body


def test_a_claim_whose_run_outlives_its_ttl_is_not_listed_as_ended_unanswered_while_it_runs(admin_client):
    """A run may last longer than its TTL: its heartbeat renews the lease (rule 5). Its claim lasts the
    TTL from the claim and nothing renews it, so while the run went on, its copy alive, the admin's list
    said the claim "ended unanswered", the words for a copy killed while its run went on. It says so now
    only once no lease of that tick is held. (Another copy may also claim the tick then and fork an ask,
    told the lease is held: a fork, never a second run.)"""
    long = replace(HOURLY, name="long", ttl=timedelta(seconds=1))
    seen: dict = {}

    def run(*, name: str, due: datetime) -> RunResult:
        return run_locked(name, due, long.ttl, outlives_its_claim(admin_client, seen))

    clock = FakeClock(TICK)
    Scheduler(jobs=[long], now=clock.now, run=run, claim=True).step()

    assert JobRun.objects.values_list("status", flat=True).get(job_name="long") == "succeeded"
    assert 'data-kind="unanswered"' not in seen["page"] and 'data-kind="claimed"' in seen["page"]


@pytest.mark.slow
@EACH_EXECUTOR
def test_a_claim_whose_scheduler_died_while_its_run_succeeded_is_not_listed_as_claimed(
    db_url, admin_client, workers
):
    """A scheduler SIGKILLed (the OOM killer, a crash) while its run goes on in a child or a pool's
    worker: the run ends within its lease and succeeds; no copy asks for that slot again, so nothing
    closes its claim. ``Tick.status`` "claimed" means "its ask has not ended" (models.CLAIMED): once
    the claim ended, the admin's list says it ended unanswered (it said "claimed" for ever)."""
    # The run ends within its lease: nothing need renew it once its scheduler is gone.
    env = slow_write_env(db_url, schedule="* * * * * */10", seconds=2, ttl=10, workers=workers)
    scheduler = start_scheduler(env, "slow_write")
    try:
        running = JobRun.objects.filter(job_name="slow_write", status="running")
        wait_for(running.exists, timeout=60, what="a run of slow_write")
        scheduler.kill()  # not its run's process
        run = running.get()
        done = JobRun.objects.filter(pk=run.pk, status="succeeded")
        wait_for(done.exists, timeout=30, what="the run to succeed without its scheduler")
    finally:
        scheduler.kill()
        scheduler.communicate(timeout=30)
    claim = Tick.objects.filter(job_name="slow_write", tick=run.tick)
    ended = claim.filter(until__lt=Now())
    wait_for(ended.exists, timeout=30, what="its claim to end (the TTL): another copy could take it now")
    claim = claim.get()

    listing = admin_client.get("/admin/locks/tick/")

    assert [row.pk for row in listing.context["cl"].result_list] == [claim.pk]
    page = listing.content.decode()
    assert 'data-kind="claimed"' not in page and 'data-kind="unanswered"' in page, claim.status


@pytest.mark.slow
def test_a_slot_a_crontab_pass_won_and_failed_gets_its_retry_from_a_scheduler_beside_it(
    db_url, tmp_path, settings
):
    """A crontab line and run_scheduler side by side (docs/deployment-cron.md: "any other scheduler can
    run the same jobs alongside"), a job every minute whose TTL (120 s) is longer than its period, as
    send_reminders' is, and one retry 1 s after a failure. The pass wins the slot's claim and its run
    fails; the lease row lets the second attempt start a second later. The pass never asks again, but
    its claim ends with it, and the scheduler, told "claimed by another copy", looks again after the
    job's first retry delay. Before, the pass's claim lasted its TTL and the scheduler looked again
    only then, past the slot's chance: the retry was never asked for. The scheduler's clock is fake
    (from a second into the slot); the database's, which judges the retry delay and the ledger, real."""
    refuse = refuse_every_minute(settings, retry={"delays": [1]})
    env, code = cron_pass(
        db_url, tmp_path, "refuse", **REFUSE_EVERY_MINUTE, REFUSE_RETRY="1", REFUSE_SECONDS="2"
    )
    cron = spawn(code, env=env)
    try:
        running = JobRun.objects.filter(job_name="refuse", status="running")
        wait_for(running.exists, timeout=60, what="the crontab pass's run")
        slot = running.get().tick
        clock = FakeClock(slot + timedelta(seconds=1), end=slot + timedelta(seconds=59))
        scheduler = Scheduler(jobs=[refuse], now=clock.now, stop=clock.stop, claim=True)
        scheduler.step()  # its wake at the slot: the pass's claim stands
        _out, err = cron.communicate(timeout=60)
    finally:
        cron.kill()
    assert cron.returncode == 1, err  # its run failed
    assert Tick.objects.filter(tick=slot, status="asked", until__lte=Now()).exists()  # its claim ended
    wait_for(SyncLock.objects.filter(retry_at__lte=Now()).exists, timeout=10, what="the retry delay")
    assert SyncLock.objects.values_list("tick", "tick_done", "tick_attempts").get() == (slot, False, 1)
    assert ledger_of(refuse, slot) == ("pending", 1)  # the lease row lets its second attempt start

    scheduler.run_forever(wait=clock.wait)  # the rest of the slot's chance, from its look at slot + 3 s

    assert list(JobRun.objects.order_by("attempt").values_list("tick", "attempt")) == [(slot, 1), (slot, 2)]


@pytest.mark.slow
def test_a_slot_a_crontab_pass_won_but_could_not_run_is_asked_for_by_a_scheduler_beside_it(
    db_url, tmp_path, settings
):
    """The pass of ``test_a_slot_a_crontab_pass_won_and_failed_...``, but its run is skipped, not failed:
    an operator's Run now holds the lease at the minute (the same goes for a pause resumed within the
    slot, or the database unreachable for a moment at :00: rule 12's "a 0.2 s restart at :00 does not
    lose the hour"). ``run_job`` exits 0 for each of those skips, so the pass keeps its claim for the
    TTL (120 s, longer than the period) before; the lease row would run the slot once the forced run
    ends (the ledger says pending), but the scheduler beside the pass was told "claimed by another copy"
    through the slot's whole chance. A pass now ends the claim of every slot its run did not settle."""
    refuse = refuse_every_minute(settings)
    forced = acquire("refuse", None, refuse.ttl, holder="runnow:1:aaaaaa")  # an operator's Run now
    assert not isinstance(forced, Skip)
    env, code = cron_pass(db_url, tmp_path, "refuse", **REFUSE_EVERY_MINUTE)
    ran = subprocess.run(
        [sys.executable, *code], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert ran.returncode == 0, ran.stderr
    assert "reason=held by runnow:1:aaaaaa" in (tmp_path / "log" / "refuse.log").read_text()
    slot = Tick.objects.get(job_name="refuse").tick
    assert release(lease=forced, status="succeeded")  # the forced run ended: the slot may run now
    assert ledger_of(refuse, slot) == ("pending", 0)

    clock = FakeClock(datetime.now(UTC), end=slot + timedelta(seconds=59))
    scheduler = Scheduler(jobs=[refuse], now=clock.now, stop=clock.stop, claim=True)
    scheduler.run_forever(wait=clock.wait)  # the rest of the slot's chance

    assert JobRun.objects.filter(job_name="refuse", tick=slot).exists(), Tick.objects.values().get()


@pytest.mark.slow
def test_a_failed_runs_claim_ends_with_its_run_not_with_the_slowest_run_of_its_pass(
    db_url, tmp_path, settings
):
    """``test_a_slot_a_crontab_pass_won_and_failed_...`` with a second job due in the same pass, whose run
    takes longer (a sync of a few minutes, beside send_reminders every minute). The failed run's claim
    ends with its run, while the slow one goes on: it ended with the pass before, once its slowest run
    did, so a scheduler beside it, told "claimed by another copy" through the failed slot's chance, never
    asked for its retry (found with a 75 s run beside a scheduler; here the claim is read)."""
    refuse_every_minute(settings, retry={"delays": [1]})
    slow = {"SLOW_WRITE_SCHEDULE": "* * * * *", "SLOW_WRITE_SECONDS": "30", "SLOW_WRITE_TTL": "120"}
    env, code = cron_pass(
        db_url, tmp_path, "refuse", "slow_write", **REFUSE_EVERY_MINUTE, REFUSE_RETRY="1", **slow
    )
    cron = spawn(code, env=env)
    try:
        failed = JobRun.objects.filter(job_name="refuse", status="failed")
        wait_for(failed.exists, timeout=60, what="the crontab pass's failed run of refuse")
        ended = Tick.objects.filter(job_name="refuse", tick=failed.get().tick, until__lte=Now())
        wait_for(ended.exists, timeout=10, what="the failed run's claim to end")
        pass_going_on = cron.poll() is None  # its slow run has not ended
    finally:
        cron.communicate(timeout=120)  # its slow run ends by itself
    assert pass_going_on, "the pass had ended: the claim's end proves nothing"
    assert Tick.objects.values_list("status", flat=True).get(job_name="refuse") == "asked"


def test_under_catch_up_all_a_slot_reopened_after_its_tick_row_closed_is_caught_up_by_the_next_slots_claim(
    settings,
):
    """The reset of ``test_a_slot_an_operators_reset_reopened_...`` under catch_up "all": the scheduler
    claims only the slot of now, and the ask for the next slot runs the reopened one first (the lease
    row's pending slot), its own tick row closed for good notwithstanding (that row still reads
    tick_claimed); then the next slot itself, asked again at once."""
    slot = the_slot_of_now() - 2 * HOUR  # the next slot is past too
    _blocked, clock, scheduler = blocked_by_a_far_tick(settings, slot=slot, catch_up="all")

    clock.at = slot + HOUR + timedelta(seconds=5)
    scheduler.step()
    assert Tick.objects.values_list("status", "until").get(tick=slot + HOUR)[1] is not None  # asked again
    scheduler.step()

    ran = JobRun.objects.filter(job_name="blocked", tick__in=[slot, slot + HOUR]).order_by("started_at")
    assert list(ran.values_list("tick", "status")) == [(slot, "succeeded"), (slot + HOUR, "succeeded")]
    assert Tick.objects.values_list("status", "claims", "until").get(tick=slot + HOUR) == (
        "succeeded",
        2,
        None,
    )


def fails_its_first_attempt(lease) -> dict:
    if lease.grant.attempt == 1:
        raise RuntimeError("the first attempt fails")
    return {"ran": 1}


def test_a_run_now_that_settles_a_failed_slot_closes_its_tick_row_as_succeeded_at_the_next_ask(settings):
    """Rule 3's exception: the slot's first attempt failed (its tick row open, the scheduler to ask again
    after the retry delay); an operator's Run now (``run_job --force``) is that slot's second attempt,
    whatever the delay, and succeeds. The scheduler's ask at the retry time is told the slot is done:
    its tick row reads succeeded and is closed for good, and no third run starts."""
    job = {"schedule": "0 * * * *", "ttl": 60, "retry": {"delays": [60, 300]}}
    register(settings, flaky_once={**job, "callable": f"{__name__}.fails_its_first_attempt"})
    flaky_once, slot = jobs()["flaky_once"], the_slot_of_now()
    clock = FakeClock(slot + timedelta(seconds=5))
    scheduler = Scheduler(jobs=[flaky_once], now=clock.now, claim=True)
    scheduler.step()
    assert Tick.objects.values_list("status", "until").get()[0] == "failed"

    forced = run_job(name="flaky_once", force=True, requested_by="admin:ops")
    assert (forced.outcome, forced.tick, forced.grant.attempt) == ("succeeded", slot, 2)
    clock.at = slot + timedelta(minutes=1, seconds=6)
    scheduler.step()

    runs = JobRun.objects.filter(job_name="flaky_once").order_by("started_at")
    assert list(runs.values_list("tick", "attempt", "status", "requested_by")) == [
        (slot, 1, "failed", "scheduler"),
        (slot, 2, "succeeded", "admin:ops"),
    ]
    assert Tick.objects.values_list("status", "claims", "until").get() == ("succeeded", 2, None)
    assert ledger_of(flaky_once, slot) == ("succeeded", 2)
