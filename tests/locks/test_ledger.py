"""The tick ledger (issue 19, item 3): each recent slot with exactly one outcome, from the schedule,
the run history and the pause history. ``build_ledger`` is judged with an injected clock;
``job_ledgers`` and ``locks ticks`` with rows written into the past, on the database clock."""

from __future__ import annotations

import json
import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import connection
from django.test.utils import CaptureQueriesContext

from locks.models import JobPause, JobRun, Outcome, SyncLock, database_now
from locks.registry import CatchUp, get_job
from locks.runner import run_job
from locks.schedule import Schedule
from locks.status import build_ledger, job_ledgers
from tests.jobsapp.models import SlotWrite
from tests.locks.conftest import register, reschedule

NOW = datetime(2026, 12, 2, 10, 31, 0, tzinfo=UTC)  # the injected database clock


def job(schedule: str = "*/5 * * * *", **changes):
    return replace(get_job("record"), cron=Schedule(schedule), **changes)


def run(tick, status, token=1, **fields) -> dict:
    return {"tick": tick, "token": token, "status": status, "holder": "h:1:a", "started_at": tick, **fields}


def outcomes(ledger) -> list[str]:
    return [slot.outcome for slot in ledger.slots]


@pytest.mark.django_db
def test_every_outcome_from_runs_written_into_the_past():
    """``*/5``, judged at 10:31: one slot of each outcome, newest first."""
    record = job()  # retry delays 30 and 60 s: three attempts per slot
    ticks = record.cron.previous(NOW, 7)  # 10:30, 10:25, … 10:00
    runs = {
        ticks[1]: [run(ticks[1], Outcome.FAILED), run(ticks[1], Outcome.SUCCEEDED, token=2)],
        ticks[2]: [run(ticks[2], Outcome.FAILED, token=3), run(ticks[2], Outcome.ABANDONED, token=4)],
        ticks[5]: [run(ticks[5], Outcome.RUNNING, token=7)],
    }
    lock = {"token": 7, "locked_until": NOW + timedelta(minutes=1), "tick": ticks[5], "paused_at": None}
    # 10:09 to 10:14:59: 10:10 was paused when its time came (lost to the pause, though resumed within
    # its chance); 10:15 was not.
    pauses = [(ticks[4] - timedelta(minutes=1), ticks[3] - timedelta(seconds=1))]

    ledger = build_ledger(record, ticks=ticks, runs=runs, lock=lock, pauses=pauses, db_now=NOW)

    assert outcomes(ledger) == ["pending", "succeeded", "failed", "missed", "paused", "running", "missed"]
    assert [slot.attempts for slot in ledger.slots] == [0, 2, 2, 0, 0, 1, 0]
    assert ledger.slots[2].describe() == "2026-12-02 10:20 UTC failed (2 attempts)"
    assert dict(ledger.counts) == {
        "pending": 1,
        "succeeded": 1,
        "failed": 1,
        "missed": 2,
        "paused": 1,
        "running": 1,
    }
    # The run of 10:05 holds the lease no more (another token has it): an attempt that failed.
    lost = build_ledger(record, ticks=ticks, runs=runs, lock={**lock, "token": 8}, pauses=[], db_now=NOW)
    assert lost.slots[5].outcome == "failed"


def test_a_slot_that_used_every_attempt_is_failed_before_the_next_slot_comes():
    hourly = job("0 * * * *", retry_delays=(timedelta(minutes=1),))  # two attempts
    [tick] = hourly.cron.previous(NOW, 1)
    once = {tick: [run(tick, Outcome.FAILED)]}
    twice = {tick: [run(tick, Outcome.FAILED), run(tick, Outcome.LOST_LOCK, token=2)]}
    assert outcomes(build_ledger(hourly, ticks=[tick], runs=once, lock={}, pauses=[], db_now=NOW)) == [
        "pending"
    ]
    assert outcomes(build_ledger(hourly, ticks=[tick], runs=twice, lock={}, pauses=[], db_now=NOW)) == [
        "failed"
    ]


def test_a_slot_superseded_by_a_later_claim_is_missed_at_once():
    """Latest policy: a copy claimed 10:35 early (the tick window), so 10:30 can no longer run."""
    record = job()
    ticks = record.cron.previous(NOW, 1)
    lock = {"token": 1, "locked_until": None, "tick": ticks[0] + timedelta(minutes=5), "paused_at": None}
    assert outcomes(build_ledger(record, ticks=ticks, runs={}, lock=lock, pauses=[], db_now=NOW)) == [
        "missed"
    ]


def test_under_the_all_policy_a_slot_keeps_its_chance_for_the_window():
    hourly = job("0 * * * *", catch_up=CatchUp("all", timedelta(hours=3)))
    ticks = hourly.cron.previous(NOW, 5)  # 10:00 … 06:00
    lock = {"token": 1, "locked_until": None, "tick": ticks[0], "paused_at": None}
    ledger = build_ledger(hourly, ticks=ticks, runs={}, lock=lock, pauses=[], db_now=NOW)
    assert outcomes(ledger) == ["pending", "pending", "pending", "missed", "missed"]  # 07:00 + 3 h < 10:31


def test_paused_only_when_the_whole_chance_passed_inside_pauses():
    record = job()
    ticks = record.cron.previous(NOW, 4)  # 10:30, 10:25, 10:20, 10:15
    pauses = [
        (ticks[3] + timedelta(seconds=1), ticks[2]),  # 10:15 was not paused at its very start
        (
            ticks[2] - timedelta(seconds=5),
            ticks[1] - timedelta(seconds=1),
        ),  # two pauses cover 10:20's chance?
        (ticks[1] - timedelta(seconds=1), None),  # … yes, with this one, still open
    ]
    ledger = build_ledger(
        record, ticks=ticks, runs={}, lock={"paused_at": ticks[1]}, pauses=pauses, db_now=NOW
    )
    assert outcomes(ledger) == ["pending", "paused", "paused", "missed"]
    assert ledger.paused


def test_an_uneven_schedule_gives_each_slot_its_own_chance():
    """``0 8,9 * * *``: 08:00's chance ends at 09:00, 09:00's at the next day's 08:00 (all UTC)."""
    twice = job("0 8,9 * * *")
    ticks = twice.cron.previous(NOW, 4)
    assert ticks == [
        NOW.replace(hour=h, minute=0) - timedelta(days=d) for d, h in ((0, 9), (0, 8), (1, 9), (1, 8))
    ]
    assert twice.chance_end(ticks[1]) == ticks[0]
    assert twice.chance_end(ticks[0]) == NOW.replace(hour=8, minute=0) + timedelta(days=1)
    runs = {ticks[1]: [run(ticks[1], Outcome.FAILED)], ticks[2]: [run(ticks[2], Outcome.SUCCEEDED)]}
    ledger = build_ledger(twice, ticks=ticks, runs=runs, lock={}, pauses=[], db_now=NOW)
    assert outcomes(ledger) == ["pending", "failed", "succeeded", "missed"]
    assert all(slot.tick.tzinfo == UTC for slot in ledger.slots)


def test_a_seconds_level_schedule():
    every_ten = job("* * * * * */10", retry_delays=())
    now = NOW + timedelta(seconds=25)
    ticks = every_ten.cron.previous(now, 4)  # :20, :10, :00, :50
    assert [tick.second for tick in ticks] == [20, 10, 0, 50]
    runs = {ticks[1]: [run(ticks[1], Outcome.SUCCEEDED)], ticks[2]: [run(ticks[2], Outcome.FAILED)]}
    ledger = build_ledger(every_ten, ticks=ticks, runs=runs, lock={}, pauses=[], db_now=now)
    assert outcomes(ledger) == ["pending", "succeeded", "failed", "missed"]


# --- from the database -------------------------------------------------------------------


def _history(job_name: str, *, runs: int) -> list:
    """``runs`` runs of ``job_name`` on its recent slots, written into the past."""
    ticks = get_job(job_name).cron.previous(database_now(), 10)
    JobRun.objects.bulk_create(
        JobRun(
            job_name=job_name,
            tick=ticks[1 + n % 9],
            holder="h:1:a",
            token=n + 1,
            started_at=ticks[1 + n % 9],
            finished_at=ticks[1 + n % 9] + timedelta(seconds=2),
            status=Outcome.FAILED if n % 9 == 3 else Outcome.SUCCEEDED,
            requested_by="cron",
        )
        for n in range(runs)
    )
    return ticks


@pytest.mark.django_db
def test_locks_ticks_prints_the_ledger_newest_first(settings):
    reschedule(settings, "record", "0 3 * * *")  # a new slot may begin during the test only at 03:00 UTC
    ticks = _history("record", runs=9)
    out = StringIO()
    call_command("locks", "ticks", "record", "--last", "5", "--json", stdout=out)
    slots = json.loads(out.getvalue())
    assert [slot["tick"] for slot in slots] == [tick.isoformat() for tick in ticks[:5]]
    assert [slot["outcome"] for slot in slots] == ["pending", "succeeded", "succeeded", "succeeded", "failed"]
    assert slots[4]["runs"][0]["requested_by"] == "cron" and slots[4]["runs"][0]["status"] == "failed"
    table = StringIO()
    call_command("locks", "ticks", "record", "--last", "2", stdout=table)
    assert table.getvalue().splitlines()[0].split()[:4] == ["TICK", "(UTC)", "LOCAL", "(UTC)"]
    local = f"{ticks[1]:%Y-%m-%d %H:%M}".split()
    assert table.getvalue().splitlines()[2].split()[:6] == [
        ticks[1].isoformat(),
        *local,
        "UTC",
        "succeeded",
        "1",
    ]
    assert slots[0]["local"] == ticks[0].isoformat()  # in the job's zone: UTC here


@pytest.mark.django_db
def test_locks_ticks_refuses_an_unknown_job_with_exit_2_and_a_bad_count():
    with pytest.raises(CommandError) as unknown:
        call_command("locks", "ticks", "nope", stdout=StringIO())
    assert unknown.value.returncode == 2 and str(unknown.value).startswith("no job named 'nope'")
    with pytest.raises(CommandError, match="argument --last: '0' is not a whole number of slots, 1 or more"):
        call_command("locks", "ticks", "record", "--last", "0", stdout=StringIO())


@pytest.mark.django_db
@pytest.mark.parametrize("runs", [10, 1000])
@pytest.mark.parametrize("slots", [10, 500])
def test_the_ledger_costs_four_queries_whatever_the_slots_runs_or_jobs(settings, runs, slots):
    reschedule(settings, "record", "* * * * *")
    settings.LOCKS_LEDGER_SLOTS = slots
    ticks = _history("record", runs=runs)
    _history("write_slot", runs=runs)
    JobPause.objects.create(job_name="record", paused_at=database_now() - timedelta(hours=3), paused_by="cli")
    for name in ("record", "write_slot", "refuse"):  # each job started long before its ledger's slots
        SyncLock.objects.update_or_create(
            job_name=name, defaults={"created_at": database_now() - timedelta(days=30)}
        )
    with CaptureQueriesContext(connection) as queries:
        ledgers = job_ledgers(jobs=[get_job(name) for name in ("record", "write_slot", "refuse")])
    assert len(queries) == 4
    assert [len(ledger.slots) for ledger in ledgers.values()] == [slots] * 3
    # The history's slots 1 to 9 but 4 (failed) succeeded; the ledger's window moves if a minute
    # boundary passes between the history and the ledger (1,000 runs take a while): count those in it.
    shown = {slot.tick for slot in ledgers["record"].slots}
    succeeded = [tick for n, tick in enumerate(ticks) if n not in (0, 4) and tick in shown]
    assert len(succeeded) >= 7 and ledgers["record"].counts["succeeded"] == len(succeeded)
    assert ledgers["refuse"].counts["missed"] == slots - 1


def test_a_bad_ledger_length_fails_its_check(settings):
    settings.LOCKS_LEDGER_SLOTS = 0
    [error] = [m for m in run_checks() if m.id == "locks.E008"]
    assert error.msg == "LOCKS_LEDGER_SLOTS must be a whole number of slots, 1 or more, got 0."


@pytest.mark.django_db
@pytest.mark.parametrize("catch_up", ["latest", "all"])
def test_a_forced_run_after_a_failed_attempt_settles_the_slot_for_the_ledger_status_and_scheduler(
    settings, catch_up
):
    """Issue 38: a failed attempt, then ``run_job --force`` that succeeds. The forced run is the
    slot's next attempt (the retry delay does not bind it), its fenced write marks the slot done,
    and every reader agrees: the ledger says succeeded, ``locks status`` succeeded and done, and
    a later scheduled run of that slot skips it as done."""
    settings.LOCKS_TICK_WINDOW = 0  # the slot of now is the latest one at or before now
    register(
        settings, refuse={**settings.LOCKS_JOBS["refuse"], "schedule": "0 * * * *", "catch_up": catch_up}
    )
    failed = run_job(name="refuse")
    assert (failed.outcome, failed.grant.attempt, failed.grant.retry_delay) == (
        "failed_expected",
        1,
        timedelta(seconds=30),
    )
    register(settings, refuse={**settings.LOCKS_JOBS["refuse"], "callable": "tests.jobsapp.jobs.write_slot"})

    forced = run_job(name="refuse", force=True, requested_by="admin:alice")

    assert (forced.outcome, forced.tick, forced.grant.attempt) == ("succeeded", failed.tick, 2)
    assert " forced=yes " in forced.describe() and f"tick={failed.tick.isoformat()}" in forced.describe()
    assert SlotWrite.objects.get().tick == failed.tick  # the lease named the slot it settled
    [slot] = [s for s in job_ledgers(jobs=[get_job("refuse")])["refuse"].slots if s.tick == failed.tick]
    assert (slot.outcome, slot.attempts) == ("succeeded", 2)
    assert [run["requested_by"] for run in slot.runs] == ["", "admin:alice"]
    out = StringIO()
    call_command("locks", "status", "--json", stdout=out)
    [status] = [row for row in json.loads(out.getvalue()) if row["job"] == "refuse"]
    assert (status["last_status"], status["tick"]) == ("succeeded", failed.tick.isoformat())
    assert SyncLock.objects.get(job_name="refuse").tick_done
    later = run_job(name="refuse", requested_by="scheduler")
    assert (later.outcome, later.skip.reason) == ("skipped", "tick_claimed")
    assert later.reason == f"tick {failed.tick.isoformat()} already done by {forced.holder}"
    # A forced run when the slot of now is done claims none: it runs beside the schedule.
    again = run_job(name="refuse", force=True)
    assert (again.outcome, again.tick, again.grant.attempt) == ("succeeded", None, None)


@pytest.mark.django_db
def test_the_ledgers_window_of_runs_is_read_from_an_index_not_the_jobs_whole_history(settings):
    """A ledger reads the runs of its window of slots: through the runs' (job, tick) index (locks
    0015), not by reading every run the job kept (2,000 slots of a job every minute here)."""
    reschedule(settings, "record", "* * * * *")
    slots = Schedule("* * * * *").previous(database_now(), 2000)
    JobRun.objects.bulk_create(
        JobRun(
            job_name="record", tick=tick, holder="h:1:a", token=n, started_at=tick, status=Outcome.SUCCEEDED
        )
        for n, tick in enumerate(slots, start=1)
    )
    SyncLock.objects.create(job_name="record", created_at=slots[-1])
    with connection.cursor() as cursor:
        cursor.execute("ANALYZE")
    with CaptureQueriesContext(connection) as queries:
        ledger = job_ledgers(jobs=[get_job("record")])["record"]

    newer = [slot.tick for slot in ledger.slots].index(slots[0])  # a minute's end in between: 1
    assert ledger.counts["succeeded"] == settings.LOCKS_LEDGER_SLOTS - newer
    [runs] = [query["sql"] for query in queries.captured_queries if 'FROM "locks_jobrun"' in query["sql"]]
    with connection.cursor() as cursor:
        cursor.execute(f"EXPLAIN {'QUERY PLAN ' if connection.vendor == 'sqlite' else ''}{runs}")
        plan = "\n".join(str(row) for row in cursor.fetchall())
    assert "jobrun_job_tick" in plan, plan


@pytest.mark.django_db(transaction=True)
def test_a_run_interrupted_before_its_body_is_no_attempt_to_the_ledger(settings, monkeypatch):
    """Rule 12: "an attempt is used by a body that started: a run interrupted between its lease and its body
    gives its attempt back" (a SIGTERM of a rolling deploy while ``run_job`` takes its lease). A job
    without retries has one attempt a slot: that slot still has it, and the lease row runs it for the
    next copy that asks. The ledger counted the slot's runs instead, so ``locks ticks``, /metrics and
    check_jobs (two failed slots in a row open an incident) called the slot failed, its chance over; it
    reads the lease row's count of the attempts its tick used."""
    from locks import runner

    register(settings, once={"schedule": "0 * * * *", "callable": "tests.jobsapp.jobs.record", "ttl": 60})
    once, now = get_job("once"), database_now()
    if once.cron.next_slot(now) - now < timedelta(seconds=60):  # the slot's chance well ahead of the test
        time.sleep((once.cron.next_slot(now) - now).total_seconds() + 1)
    slot = once.cron.slot_at_or_before(database_now())
    started = runner._record_start

    def signalled_as_it_starts(lease, **kwargs):  # the SIGTERM lands while the run records its lease
        run_id = started(lease, **kwargs)
        runner.interrupt(SystemExit(143))  # held back until the body would begin
        return run_id

    monkeypatch.setattr(runner, "_record_start", signalled_as_it_starts)
    with pytest.raises(SystemExit):
        run_job(name="once", tick=slot)
    monkeypatch.undo()
    run = JobRun.objects.get(job_name="once")
    assert (run.tick, run.status) == (slot, "failed") and "its attempt is not used" in run.error
    lock = SyncLock.objects.get(job_name="once")
    assert (lock.tick, lock.tick_done, lock.tick_attempts, lock.locked_until) == (slot, False, 0, None)

    (ledger_slot,) = [s for s in job_ledgers(jobs=[once])["once"].slots if s.tick == slot]

    assert ledger_slot.outcome == "pending", (ledger_slot.outcome, ledger_slot.attempts)
