"""Three hosts (network namespaces) sharing one PostgreSQL server and one stand-in.

Each host runs its own ``manage.py sync_contests`` inside ``ip netns exec`` and
reaches the database and the stand-in only over its own veth link.
"""

from __future__ import annotations

import os
import re
import time
from collections import Counter
from collections.abc import Iterator

import environ
import pytest
from django.db.models import F

from contests.models import Contest
from locks.models import JobRun, SyncLock
from tests.conftest import database_url, project_env
from tests.faults.support import wait_until
from tests.standin import Standin, load_fixture, serve

TICK_1 = "2026-03-04T10:00:00+00:00"
TICK_2 = "2026-03-04T11:00:00+00:00"


@pytest.fixture
def network_standin(request) -> Iterator:
    """``network_standin(address)``: a stand-in listening on one address of the sandbox."""
    servers = []

    def start(address: str) -> Standin:
        fake = Standin()
        server = serve(fake, host=address)
        servers.append(server)
        fake.url = f"http://{address}:{server.server_port}/api"
        return fake

    try:
        yield start
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def host_env(postgres: str, box, fake: Standin, **extra: str) -> dict[str, str]:
    return project_env(
        DATABASE_URL=database_url(environ.Env.db_url_config(postgres), host=box.gateway),
        CODEFORCES_API_URL=fake.url,
        **extra,
    )


def run_tick(procs, hosts, tick: str, env: dict[str, str]) -> list:
    copies = [
        procs.manage(
            "sync_contests", "--tick", tick, env=env, prefix=host.exec_prefix(), name=f"host {host.number}"
        )
        for host in hosts
    ]
    for copy in copies:
        assert copy.wait(timeout=90) == 0, copy.transcript()
        assert "Traceback" not in copy.stderr, copy.transcript()
    return copies


@pytest.mark.slow
@pytest.mark.scenario("three-hosts")
def test_three_hosts_sync_once_per_tick(postgres, sandbox, network_standin, procs, observe):
    box = sandbox(3)
    fake = network_standin(box.gateway)
    env = host_env(postgres, box, fake, SYNC_CONTESTS_LOCK_TTL="30")

    first = run_tick(procs, box.hosts, TICK_1, env)
    second = run_tick(procs, box.hosts, TICK_2, env)

    for copies in (first, second):
        assert Counter(copy.result()["outcome"] for copy in copies) == {"succeeded": 1, "skipped": 2}
    assert fake.calls == 2  # one fetch per tick, by the winner only
    assert list(JobRun.objects.order_by("token").values_list("token", "status")) == [
        (1, "succeeded"),
        (2, "succeeded"),
    ]
    created = [
        next(c.field("created") for c in copies if c.result()["outcome"] == "succeeded")
        for copies in (first, second)
    ]
    assert created == ["1758", "0"]
    assert Contest.objects.count() == 1758
    winners = [
        next(c.name for c in copies if c.result()["outcome"] == "succeeded") for copies in (first, second)
    ]
    observe(
        f"tick 1: 1 sync ({winners[0]}, created 1758) + 2 skips; tick 2: 1 sync ({winners[1]}, 1758 "
        "unchanged) + 2 skips; 2 fetches in all"
    )


@pytest.mark.slow
@pytest.mark.scenario("partition")
def test_partitioned_holder_aborts_and_another_host_takes_the_next_tick(
    postgres, sandbox, network_standin, gate, procs, observe
):
    ttl = 3  # heartbeat every second; the lease is gone 3 s after the last one
    box = sandbox(3)
    fake = network_standin(box.gateway)
    # The holder's fetch is held until the test lets it go: a slow sync whose answer
    # arrives after its lease is gone. Later fetches pass.
    fake.hook = gate
    env = host_env(
        postgres,
        box,
        fake,
        SYNC_CONTESTS_LOCK_TTL=str(ttl),
        CODEFORCES_READ_TIMEOUT="90",
        CODEFORCES_MAX_ATTEMPTS="1",
    )
    copies = {
        host.number: procs.manage(
            "sync_contests", "--tick", TICK_1, env=env, prefix=host.exec_prefix(), name=f"host {host.number}"
        )
        for host in box.hosts
    }
    wait_until(lambda: gate.arrived, timeout=60, what="the holder to start fetching")
    holder_pid = int(SyncLock.objects.get(job_name="sync_contests").holder.split(":")[1])
    holder_host = next(host for host in box.hosts if os.getsid(holder_pid) == copies[host.number].pid)
    holder = copies[holder_host.number]
    others = [host for host in box.hosts if host is not holder_host]
    for host in others:
        assert copies[host.number].wait(timeout=60) == 0
        assert copies[host.number].result()["outcome"] == "skipped"

    # Cut once the heartbeat has renewed over its own connection: the next renewal is sent
    # into the void and fails on the connection's timeouts (tcp_user_timeout 10 s).
    wait_until(
        lambda: SyncLock.objects.filter(job_name="sync_contests", heartbeat_at__gt=F("acquired_at")).exists(),
        timeout=30,
        what="the holder's first heartbeat",
    )
    holder_host.cut()
    cut_at = time.monotonic()

    # While the holder is cut off and still running, its lease runs out by the database
    # clock and one of the other hosts takes the next tick.
    wait_until(
        lambda: SyncLock.objects.expired().exists(), timeout=ttl * 5, what="the cut holder's lease to expire"
    )
    next_copies = run_tick(procs, others, TICK_2, env)
    assert holder.popen.poll() is None  # the old holder is still alive, still fetching
    assert Counter(copy.result()["outcome"] for copy in next_copies) == {"succeeded": 1, "skipped": 1}
    winner = next(copy for copy in next_copies if copy.result()["outcome"] == "succeeded")
    assert winner.field("token") == "2"
    assert winner.field("created") == "1758"

    # The old holder's heartbeat fails; the link comes back and its (now stale) answer
    # arrives, different from what is stored: had it written, the names would show it.
    holder.wait_for(r"WARNING .*heartbeat", timeout=60)  # hang guard, far above TTL/3 + 10 s
    noticed_after = time.monotonic() - cut_at
    payload = load_fixture()
    for contest in payload["result"]:
        contest["name"] = "STALE " + contest["name"]
    fake.set_payload(payload)
    holder_host.heal()
    gate.open()
    code = holder.wait(timeout=90)

    assert "Traceback" not in holder.stderr, holder.transcript()
    assert code == 1, holder.transcript()
    assert holder.result()["outcome"] == "lost_lock"
    assert fake.calls == 2
    assert Contest.objects.count() == 1758
    assert not Contest.objects.filter(name__startswith="STALE ").exists()  # it wrote nothing
    # It recorded its run as lost (on a new connection if its old one died in the cut),
    # and its release, matching its old token, left the new holder's record alone.
    assert list(JobRun.objects.order_by("token").values_list("token", "status")) == [
        (1, "lost_lock"),
        (2, "succeeded"),
    ]
    lock = SyncLock.objects.get(job_name="sync_contests")
    assert (lock.token, lock.last_status, lock.locked_until) == (2, "succeeded", None)
    cause = re.search(r"could not renew the lease: (\w+: [^.\n]*)", holder.stderr).group(1)
    observe(
        f"link of host {holder_host.number} (the holder) cut; its lease expired and "
        f"{winner.name} synced the next tick (token 2, 1758 created) while it was still cut off; "
        f"its heartbeat failed {noticed_after:.0f} s after the cut ({cause}); link back, stale answer "
        f"delivered: exit {code}, outcome=lost_lock logged and recorded, 0 rows written, new holder's "
        "lock row untouched, no traceback"
    )
