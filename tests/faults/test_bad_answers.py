"""Codeforces answers that used to hold the lease without end or stop every sync."""

from __future__ import annotations

import time

import pytest

from contests.models import Contest
from locks.models import JobRun, SyncLock
from tests.standin import load_fixture

TICK_1 = "2026-03-05T10:00:00+00:00"
TICK_2 = "2026-03-05T11:00:00+00:00"
DEADLINE = 2


def lines(text: str, level: str) -> list[str]:
    return [line for line in text.splitlines() if f" {level} " in line]


@pytest.mark.slow
@pytest.mark.scenario("stalled-answer")
def test_a_stalled_answer_ends_at_the_total_deadline(fault_env, standin, procs, observe):
    # The headers at once, then one byte every 0.2 s: the 30 s read timeout never fires.
    standin.trickle, standin.trickle_for = 0.2, 90
    env = fault_env(CODEFORCES_TOTAL_TIMEOUT=str(DEADLINE))

    started = time.monotonic()
    stalled = procs.manage("sync_contests", "--tick", TICK_1, env=env, name="stalled fetch")
    code = stalled.wait(timeout=60)  # hang guard: without the deadline it would run 90 s
    elapsed = time.monotonic() - started
    trickled = standin.trickled

    assert code == 1, stalled.transcript()
    assert "Traceback" not in stalled.stderr, stalled.transcript()
    assert stalled.result()["outcome"] == "failed"
    [error] = lines(stalled.stderr, "ERROR")
    message = f"did not answer within {DEADLINE} s (total deadline CODEFORCES_TOTAL_TIMEOUT)"
    assert message in error, stalled.transcript()
    assert trickled >= 2 and standin.calls == 1  # it was answering, just too slowly
    assert not Contest.objects.exists()
    lock = SyncLock.objects.get(job_name="sync_contests")
    assert (lock.locked_until, lock.last_status) == (None, "failed")  # released, not held on

    standin.trickle = 0  # Codeforces answers normally again
    following = procs.manage("sync_contests", "--tick", TICK_2, env=env, name="next tick")
    assert following.wait(timeout=60) == 0, following.transcript()
    assert following.result()["outcome"] == "succeeded"
    assert Contest.objects.count() == 1758
    assert list(JobRun.objects.order_by("token").values_list("status", flat=True)) == ["failed", "succeeded"]
    observe(
        f"exit 1 after {elapsed:.1f} s ({trickled} bytes trickled; the 30 s read timeout never fired): "
        f"one ERROR line `{message}`, no traceback, 0 rows, lease released; the next tick created "
        f"{following.field('created')}"
    )


POISON = [
    ("id 2**31", {"id": 2**31}),
    ("id 2**63", {"id": 2**63}),
    ("duration 10**20 s", {"durationSeconds": 10**20}),
    ("start time 10**20", {"startTimeSeconds": 10**20}),
    ("NUL in the name", {"name": "Round\x00 1"}),
    ("NUL in the type", {"type": "C\x00F"}),
    ("unpaired surrogate", {"name": "Round \ud800"}),
]


@pytest.mark.slow
@pytest.mark.scenario("poison-entry")
def test_poison_entries_are_counted_invalid_and_the_rest_synced(fault_env, standin, procs, observe):
    payload = load_fixture()
    template = payload["result"][0]
    for number, (_what, poison) in enumerate(POISON):
        entry = {**template, "id": 5_000_000 + number, "name": f"Poisoned {number}", **poison}
        payload["result"].insert(10 * number, entry)
    standin.set_payload(payload)
    env = fault_env()

    first = procs.manage("sync_contests", "--tick", TICK_1, env=env, name="first sync")
    assert first.wait(timeout=60) == 0, first.transcript()
    second = procs.manage("sync_contests", "--tick", TICK_2, env=env, name="next tick")
    assert second.wait(timeout=60) == 0, second.transcript()

    for run in (first, second):
        assert "Traceback" not in run.stderr, run.transcript()
        assert run.result()["outcome"] == "succeeded", run.transcript()
        assert run.field("invalid") == str(len(POISON)), run.transcript()
        assert not lines(run.stderr, "ERROR"), run.transcript()
        [warning] = [line for line in lines(run.stderr, "WARNING") if "invalid entries" in line]
        assert f"skipped {len(POISON)} invalid entries" in warning
    assert (first.field("created"), second.field("unchanged")) == ("1758", "1758")
    assert Contest.objects.count() == 1758
    assert not Contest.objects.filter(name__startswith="Poisoned").exists()
    observe(
        f"exit 0 twice, outcome=succeeded: created={first.field('created')} then "
        f"unchanged={second.field('unchanged')}, invalid={first.field('invalid')} each time "
        f"({', '.join(what for what, _poison in POISON)}), one WARNING `skipped {len(POISON)} invalid "
        "entries`, no traceback"
    )
