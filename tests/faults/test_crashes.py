"""A holder killed with SIGKILL in the middle of its write transaction."""

from __future__ import annotations

import signal
import sys

import pytest

from contests.models import Contest
from locks.models import EXPIRED, JobRun, SyncLock
from locks.status import lock_states
from tests.faults.support import wait_until

TICK_1 = "2026-03-01T10:00:00+00:00"
TICK_2 = "2026-03-01T11:00:00+00:00"
TTL = 3


@pytest.mark.slow
@pytest.mark.scenario("sigkill-mid-write")
def test_sigkill_mid_write_leaves_no_partial_rows(fault_env, procs, observe):
    env = fault_env(SYNC_CONTESTS_LOCK_TTL=str(TTL))
    holder = procs.start(
        [sys.executable, "-m", "tests.faults.killpoint", "sync_contests", "--tick", TICK_1],
        env=env,
        name="holder",
    )
    inside = int(holder.wait_for(r"^MID-WRITE rows=(\d+)$", timeout=60, stream="stdout").group(1))
    # The holder had really written rows inside its open transaction when it died.
    assert inside == 1758 // 2

    holder.kill(signal.SIGKILL)

    assert holder.popen.returncode == -signal.SIGKILL
    assert Contest.objects.count() == 0
    lock = SyncLock.objects.get(job_name="sync_contests")
    assert (lock.token, lock.last_status) == (1, "running")
    assert list(JobRun.objects.values_list("token", "status")) == [(1, "running")]

    # No cleanup by hand: the lease runs out by the database clock.
    wait_until(
        lambda: [state.state for state in lock_states()] == [EXPIRED],
        timeout=TTL * 5,
        what="the dead holder's lease to expire",
    )
    following = procs.manage("sync_contests", "--tick", TICK_2, env=env, name="next tick")
    assert following.wait(timeout=60) == 0, following.transcript()
    assert following.result()["outcome"] == "succeeded"
    assert following.field("created") == "1758"
    assert following.field("token") == "2"
    assert Contest.objects.count() == 1758
    assert "Traceback" not in following.stderr
    observe(
        f"killed with {inside} of 1758 rows inserted in its transaction: 0 rows afterwards; "
        f"lease expired after {TTL} s TTL; next tick (token 2) created 1758"
    )
