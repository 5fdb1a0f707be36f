"""A sync that runs four times its lease TTL keeps the lease through the heartbeat. Four, not
three: contenders start one after another, and on a loaded machine each takes seconds to start;
the window between 2x TTL and the job's end must leave room for some to end in it."""

from __future__ import annotations

import time
from datetime import datetime, timedelta

import pytest

from contests.models import Contest
from locks.models import JobRun, SyncLock
from tests.faults.support import wait_until

TICK = "2026-03-02T10:00:00+00:00"
TTL = 3


@pytest.mark.slow
@pytest.mark.scenario("long-job")
def test_heartbeat_keeps_the_lease_of_a_job_four_times_its_ttl(fault_env, standin, procs, observe):
    arrived: list[float] = []
    standin.hook = lambda: arrived.append(time.monotonic())
    standin.delay = 4 * TTL
    env = fault_env(SYNC_CONTESTS_LOCK_TTL=str(TTL))

    job = procs.manage("sync_contests", "--tick", TICK, env=env, name="long job")
    wait_until(lambda: arrived, timeout=60, what="the long job's request to reach the stand-in")
    answer_at = arrived[0] + standin.delay  # the stand-in answers (and the job can finish) no earlier

    # Contenders for the same tick, one after another, until the job ends. While the
    # lease is alive each must skip with "held"; once the job has released, "tick claimed".
    contenders = []
    for _attempt in range(50):
        if job.popen.poll() is not None:
            break
        contender = procs.manage("sync_contests", "--tick", TICK, env=env, name=f"contender {_attempt}")
        assert contender.wait(timeout=60) == 0, contender.transcript()
        contenders.append((time.monotonic(), contender))
    assert job.wait(timeout=60) == 0, job.transcript()

    result = job.result()
    assert result["outcome"] == "succeeded"
    assert job.field("token") == "1"
    outcomes = {contender.result()["outcome"] for _ended, contender in contenders}
    assert outcomes == {"skipped"}
    during = [contender for ended, contender in contenders if ended < answer_at]
    late = [
        contender for ended, contender in contenders if ended - arrived[0] > 2 * TTL and ended < answer_at
    ]
    assert late, "no contender ran between 2xTTL and the end of the job; the test proves nothing"
    for contender in during:
        assert f"reason=held by {result['holder']} until" in contender.stdout, contender.transcript()

    lock = SyncLock.objects.get(job_name="sync_contests")
    renewed_for = lock.heartbeat_at - lock.acquired_at
    assert renewed_for > timedelta(seconds=2 * TTL)
    until = max(_until(contender.stdout) for contender in during)
    assert until - lock.acquired_at > timedelta(seconds=2 * TTL)
    assert list(JobRun.objects.values_list("token", "status")) == [(1, "succeeded")]
    assert Contest.objects.count() == 1758
    duration = float(job.field("duration").rstrip("s"))
    observe(
        f"job ran {duration:.1f} s with a {TTL} s TTL (x{duration / TTL:.1f}); last heartbeat "
        f"{renewed_for.total_seconds():.1f} s after acquiring; {len(during)} contenders during it skipped "
        f"(held), {len(contenders) - len(during)} after it (tick claimed); 1 run, token 1"
    )


def _until(stdout: str) -> datetime:
    return datetime.fromisoformat(stdout.split(" until ", 1)[1].split()[0])
