"""The lock and sync contracts against a MongoDB-wire server.

``MONGODB_URI`` names a real ``mongod`` (docs/mongodb.md); without it, this module starts
SecantusDB (tests/mongo_server.py: a MongoDB-compatible server from requirements-dev.txt, not
MongoDB itself) on a free loopback port for the run. With a local replica set::

    mongod --replSet rs0 --dbpath /tmp/rs0 --port 27017 --bind_ip 127.0.0.1 &
    mongosh --quiet --eval 'rs.initiate()'
    MONGODB_URI='mongodb://127.0.0.1:27017/?replicaSet=rs0' DJANGO_DEBUG=1 \\
        .venv/bin/python -m pytest tests/test_mongodb.py

Each run migrates a database of its own (``cfsync_test_<random>``) and drops it
at the end. Every step runs as its own OS process whose ``DATABASE_URL`` is that
database, as the project runs in production: ``manage.py sync_contests`` for
the sync, and this module as a script (``python -m tests.test_mongodb STEP``)
for single lock operations. The pytest process, on the SQL test settings, only
starts them, serves the Codeforces stand-in and reads what they print.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import secrets
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from itertools import pairwise

import pytest

from tests.conftest import ROOT, manage, project_env, spawn
from tests.standin import load_fixture

pytestmark = [pytest.mark.slow]

TICK = "2026-01-01T10:00:00+00:00"


def with_database(uri: str, name: str) -> str:
    """``uri`` naming database ``name``; credentials keep authenticating where they did."""
    scheme, _, rest = uri.partition("://")
    hosts_and_path, _, query = rest.partition("?")
    hosts, _, old_name = hosts_and_path.partition("/")
    options = [option for option in query.split("&") if option]
    if "@" in hosts and not any(option.lower().startswith("authsource=") for option in options):
        options.append(f"authSource={old_name or 'admin'}")
    return f"{scheme}://{hosts}/{name}" + (f"?{'&'.join(options)}" if options else "")


def drop_database(url: str) -> None:
    from pymongo import MongoClient

    client = MongoClient(url, serverSelectionTimeoutMS=5000)
    try:
        client.drop_database(client.get_default_database().name)
    finally:
        client.close()


@pytest.fixture(scope="module")
def mongodb_uri(tmp_path_factory) -> Iterator[str]:
    """``MONGODB_URI`` when set, else a SecantusDB server of this run's own."""
    if os.environ.get("MONGODB_URI"):
        yield os.environ["MONGODB_URI"]
        return
    from tests.mongo_server import secantusdb

    with secantusdb(log=tmp_path_factory.mktemp("secantusdb") / "server.log") as uri:
        yield uri


@pytest.fixture(scope="module")
def mongo_url(mongodb_uri) -> Iterator[str]:
    """A migrated database of this run's own."""
    url = with_database(mongodb_uri, f"cfsync_test_{secrets.token_hex(4)}")
    try:
        done = manage("migrate", "--noinput", env=project_env(DATABASE_URL=url), timeout=300)
        assert done.returncode == 0, f"migrate against {mongodb_uri} failed:\n{done.stderr}"
        yield url
    finally:
        drop_database(url)


@pytest.fixture
def mongo(mongo_url) -> str:
    """The database, emptied of what the tests write (locks, runs, pauses, rate limits, contests,
    reminders and their deliveries): every collection but Django's and the users. Straight through
    pymongo, not a Django process: a few milliseconds instead of seconds, before each test."""
    from pymongo import MongoClient

    client = MongoClient(mongo_url, serverSelectionTimeoutMS=5000)
    try:
        database = client.get_default_database()
        for name in database.list_collection_names():
            if not name.startswith(("django_", "auth_")):
                database[name].delete_many({})
    finally:
        client.close()
    return mongo_url


def step(url: str, name: str, *, env: dict[str, str] | None = None, **arguments) -> dict:
    """Run one driver step (below) in a new process against ``url`` (with ``env`` added); its
    JSON answer."""
    done = subprocess.run(
        [sys.executable, "-m", "tests.test_mongodb", name, json.dumps(arguments)],
        cwd=ROOT,
        env=project_env(DATABASE_URL=url, **(env or {})),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, f"step {name} failed:\n{done.stderr}"
    return json.loads(done.stdout.splitlines()[-1])


def sync(url: str, *args: str, standin) -> subprocess.CompletedProcess:
    env = project_env(DATABASE_URL=url, CODEFORCES_API_URL=standin.url)
    return manage("sync_contests", *args, env=env, timeout=120)


def outcome(done: subprocess.CompletedProcess) -> str:
    found = re.search(r"\boutcome=(\w+)", done.stdout)
    assert found, done.stdout + done.stderr
    return found.group(1)


def stats(done: subprocess.CompletedProcess) -> dict[str, int]:
    return {key: int(value) for key, value in re.findall(r"\b(\w+)=(\d+)\b", done.stdout)}


def expected_contests() -> int:
    return len(load_fixture()["result"])


# --- the sync -------------------------------------------------------------------


def test_one_tick_runs_once_across_processes(mongo, standin):
    """Lock semantics 1 and 3: four copies fire on the same tick, one syncs."""
    env = project_env(DATABASE_URL=mongo, CODEFORCES_API_URL=standin.url)
    command = [sys.executable, str(ROOT / "manage.py"), "sync_contests", "--tick", TICK]
    copies = [
        subprocess.Popen(
            command, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
        )
        for _ in range(4)
    ]
    results = [copy.communicate(timeout=120) for copy in copies]

    assert [copy.returncode for copy in copies] == [0, 0, 0, 0], results
    outcomes = sorted(re.search(r"outcome=(\w+)", out).group(1) for out, _err in results)
    assert outcomes == ["skipped", "skipped", "skipped", "succeeded"], results
    winner = next(re.search(r"holder=(\S+)", out).group(1) for out, _ in results if "=succeeded" in out)
    assert standin.calls == 1
    state = step(mongo, "state")
    assert state["contests"] == expected_contests()
    assert [(run["tick"], run["status"]) for run in state["runs"]] == [(TICK, "succeeded")]
    assert len(state["locks"]) == 1
    assert state["locks"][0]["token"] == 1
    assert state["locks"][0]["locked_until"] is None

    late = sync(mongo, "--tick", TICK, standin=standin)  # same slot, after the winner finished

    assert late.returncode == 0
    assert outcome(late) == "skipped"
    assert f"reason=tick {TICK} already done by {winner}" in late.stdout
    assert standin.calls == 1


def test_a_second_sync_of_the_same_answer_writes_nothing(mongo, standin):
    first = sync(mongo, "--force", standin=standin)
    before = step(mongo, "state")

    second = sync(mongo, "--force", standin=standin)
    after = step(mongo, "state")

    assert outcome(first) == outcome(second) == "succeeded", first.stderr + second.stderr
    assert stats(first)["created"] == expected_contests()
    assert stats(second)["created"] == stats(second)["updated"] == stats(second)["removed"] == 0
    assert stats(second)["unchanged"] == expected_contests()
    assert after["contest_digest"] == before["contest_digest"]  # updated_at included
    assert after["contests"] == before["contests"] == expected_contests()


BROKEN_ANSWERS = {
    "http-500": (500, b'{"status":"FAILED","comment":"internal"}'),
    "not-json": (200, b"<html>maintenance</html>"),
    "failed": (200, b'{"status":"FAILED","comment":"contestId: bad"}'),
    "empty-while-known": (200, b'{"status":"OK","result":[]}'),
    "not-a-list": (200, b'{"status":"OK","result":{"id":1}}'),
    "mostly-invalid": (200, json.dumps({"status": "OK", "result": [{"id": -1}] * 10}).encode()),
}


def test_a_broken_api_answer_changes_nothing(mongo, standin):
    """Each broken answer in turn, after one good sync (one server round trip per answer)."""
    good = sync(mongo, "--force", standin=standin)
    before = step(mongo, "state")
    assert outcome(good) == "succeeded"

    for name, (status, body) in BROKEN_ANSWERS.items():
        standin.status, standin.body = status, body
        broken = sync(mongo, "--force", standin=standin)

        assert broken.returncode == 1, (name, broken.stdout + broken.stderr)
        assert outcome(broken) == "failed", name
        assert "Traceback" not in broken.stderr, name
    after = step(mongo, "state")

    assert after["contest_digest"] == before["contest_digest"]
    assert after["contests"] == expected_contests()
    assert [run["status"] for run in after["runs"]] == ["failed"] * len(BROKEN_ANSWERS) + ["succeeded"]
    assert after["locks"][0]["locked_until"] is None  # released, with the failure recorded
    assert after["locks"][0]["last_status"] == "failed"


def test_stale_reminders_are_pruned_without_a_join_delete(mongo):
    """MongoDB cannot delete across collections: the portable form runs."""
    result = step(mongo, "prune")

    assert result["deleted"] == 3
    assert result["kept"] == [4, 5]


def test_concurrent_reminder_runs_send_each_due_reminder_once(mongo, tmp_path):
    """The reminder claim (a conditional update per reminder) across processes."""
    setup = step(mongo, "reminders", count=12)
    outbox = tmp_path / "mail"
    outbox.mkdir()
    env = project_env(
        DATABASE_URL=mongo,
        EMAIL_BACKEND="django.core.mail.backends.filebased.EmailBackend",
        EMAIL_FILE_PATH=str(outbox),
    )
    runs = [spawn([str(ROOT / "manage.py"), "send_reminders", "--force"], env=env) for _ in range(4)]
    for run in runs:
        run.communicate(timeout=120)
        assert run.returncode == 0

    sent = [
        line for path in outbox.iterdir() for line in path.read_text().splitlines() if line.startswith("To: ")
    ]
    assert sorted(sent) == sorted(f"To: {address}" for address in setup["addresses"])
    delivered = step(mongo, "reminder_state")
    assert delivered == {"delivered": 12, "attempts": [1] * 12}


# --- the HTTP trigger ---------------------------------------------------------------


def test_the_trigger_runs_a_tick_once_then_answers_409_and_429(mongo, standin):
    """POST /api/jobs/<job>/run on MongoDB as on SQL: its rate limit's first row for a client is
    an insert, which must hold plain values only (MongoDB cannot insert ``Now() + window``)."""
    token = secrets.token_urlsafe(16)
    env = {"LOCKS_TRIGGER_TOKEN": token, "CODEFORCES_API_URL": standin.url}

    first, other, again = step(
        mongo, "trigger", env=env, job="sync_contests", addresses=["192.0.2.1", "192.0.2.2", "192.0.2.1"]
    )

    assert first["status"] == 200, first
    assert first["outcome"] == "succeeded"
    assert other["status"] == 409, other
    assert other["reason"] == f"tick {first['tick']} already done by {first['holder']}"
    assert again["status"] == 429, again
    assert again["error"].startswith("rate limited: one request per 10 s per client; retry in ")
    assert standin.calls == 1
    assert [run["status"] for run in step(mongo, "state")["runs"]] == ["succeeded"]


# --- the scheduler: three replicas ----------------------------------------------------

EVERY_10_S = "* * * * * */10"  # croniter's sixth field: seconds
SCHEDULER_SLOTS = 3


def succeeded_ticks(url: str) -> list[datetime]:
    """The ticks of succeeded sync runs, read straight from the server (no Django process)."""
    from pymongo import MongoClient

    client = MongoClient(url, serverSelectionTimeoutMS=5000)
    try:
        runs = client.get_default_database()["locks_jobrun"]
        found = runs.find({"job_name": "sync_contests", "status": "succeeded"}, {"tick": 1})
        return sorted(run["tick"].replace(tzinfo=UTC) for run in found)
    finally:
        client.close()


def tick_rows(url: str) -> list[dict]:
    """The sync's Tick rows by tick, read straight from the server."""
    from pymongo import MongoClient

    client = MongoClient(url, serverSelectionTimeoutMS=5000)
    try:
        found = client.get_default_database()["locks_tick"].find({"job_name": "sync_contests"})
        rows = [{**row, "tick": row["tick"].replace(tzinfo=UTC)} for row in found]
        return sorted(rows, key=lambda row: row["tick"])
    finally:
        client.close()


def test_three_schedulers_run_each_slot_once(mongo, standin):
    env = project_env(
        DATABASE_URL=mongo,
        CODEFORCES_API_URL=standin.url,
        SYNC_CONTESTS_SCHEDULE=EVERY_10_S,
        SYNC_CONTESTS_LOCK_TTL="8",
        LOCKS_SCHEDULER_GRACE="5",
    )
    schedulers = [
        spawn([str(ROOT / "manage.py"), "run_scheduler", "sync_contests"], env=env) for _ in range(3)
    ]
    try:
        deadline = time.monotonic() + 120
        while len(succeeded_ticks(mongo)) < SCHEDULER_SLOTS and time.monotonic() < deadline:
            time.sleep(1)
    finally:
        for scheduler in schedulers:
            scheduler.send_signal(signal.SIGTERM)
        outputs = [scheduler.communicate(timeout=60) for scheduler in schedulers]
    ticks = succeeded_ticks(mongo)

    assert [scheduler.returncode for scheduler in schedulers] == [0, 0, 0], [err for _, err in outputs]
    assert all("Traceback" not in err for _, err in outputs), [err for _, err in outputs]
    assert len(ticks) >= SCHEDULER_SLOTS, f"{len(ticks)} slots ran in 2 minutes: {ticks}"
    assert len(set(ticks)) == len(ticks), f"a slot ran twice: {ticks}"
    # Every slot from the first to the last, none skipped (the replicas started at once).
    assert [(later - earlier).total_seconds() for earlier, later in pairwise(ticks)] == [10.0] * (
        len(ticks) - 1
    )
    assert standin.calls == len(ticks)
    # Claim before spawn: one Tick row per slot, closed for good by the copy that ran it.
    rows = tick_rows(mongo)
    assert len({row["tick"] for row in rows}) == len(rows), f"a slot has two Tick rows: {rows}"
    succeeded = [row for row in rows if row["status"] == "succeeded"]
    assert [row["tick"] for row in succeeded] == ticks, rows
    assert all(row["until"] is None for row in succeeded), succeeded


# --- claim before spawn: a Tick row per (job, tick), its unique index deciding ----------

CLAIM_ASKS = 20


def test_tick_claims_the_first_holder_wins_and_the_index_refuses_a_second_row(mongo):
    """TickQuerySet.claim's ORM path (a conditional update, then the insert of an open row the
    unique index may refuse, then the update again) across three holders, 20 asks each."""
    result = step(mongo, "tick_claims", asks=CLAIM_ASKS)
    jobs = [f"job{index:02}" for index in range(CLAIM_ASKS)]

    assert result["duplicate"] == "IntegrityError: True"  # the backend's, from pymongo's E11000
    assert result["won"] == {"a": jobs, "b": [], "c": []}
    assert result["again"] == jobs, "a holder asking again wins its own claim again"
    assert result["rows"] == {"count": CLAIM_ASKS, "holders": ["a"], "claims": [2]}
    first = result["first"]
    assert first["created_at"] is not None and first["created_at"] > "2000"  # the open row's value is gone
    assert first["created_at"] == first["created_after_again"], "first claimed: kept on a claim again"
    assert 0 <= first["age"] < 60, first
    assert result["expiry"] == {"a": ["expiring"], "b_during": [], "b_after": ["expiring"], "claims": 2}
    assert result["closed"] == {"b_after_final": [], "c_after_again": ["job01"], "job01_claims": 3}
    # What a claim sends (pymongo's command monitoring): the first claim of the process lists the
    # collections once; a loser pays two commands an ask, a holder asking again one.
    assert result["commands"]["a"] == {"listCollections": 1, "update": 40, "insert": 20}
    assert result["commands"]["b"] == {"update": 20, "insert": 20}
    assert result["commands"]["again"] == {"update": 20}


def test_tick_claims_racing_from_three_processes_win_each_tick_once(mongo):
    start = time.time() + 6  # each process is set up and connected by then
    tick = datetime.now(UTC).replace(microsecond=0).isoformat()
    racers = [
        subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tests.test_mongodb",
                "tick_race",
                json.dumps({"asks": CLAIM_ASKS, "tick": tick, "start": start}),
            ],
            cwd=ROOT,
            env=project_env(DATABASE_URL=mongo),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(3)
    ]
    answers = [racer.communicate(timeout=120) for racer in racers]
    assert [racer.returncode for racer in racers] == [0, 0, 0], [err for _, err in answers]
    won = [json.loads(out.splitlines()[-1]) for out, _ in answers]

    every = sorted(job for answer in won for job in answer["won"])
    assert every == [f"job{index:02}" for index in range(CLAIM_ASKS)], won  # each once, none lost
    rows = step(mongo, "tick_rows")
    assert len(rows) == CLAIM_ASKS
    assert {row["holder"] for row in rows} <= {answer["holder"] for answer in won}
    assert {row["claims"] for row in rows} == {1}
    # Each ask: the update, the insert, and the update again for the one copy whose insert went in.
    for answer in won:
        assert answer["commands"] == {"update": CLAIM_ASKS + len(answer["won"]), "insert": CLAIM_ASKS}, answer


def test_tick_claims_refuse_a_collection_without_its_index_every_time(mongodb_uri):
    """Without the migration the collection would appear on the first insert, unindexed: every claim
    refuses until the table is there (only its presence is remembered)."""
    bare = with_database(mongodb_uri, f"cfsync_bare_{secrets.token_hex(4)}")
    try:
        result = step(bare, "tick_claim_bare")
    finally:
        drop_database(bare)

    assert (
        result["errors"] == ["ProgrammingError: the table locks_tick is missing: run `manage.py migrate`"] * 2
    )
    assert result["commands"] == {"listCollections": 2}


def test_the_tick_migration_backfills_the_run_history_in_plain_values(mongodb_uri):
    """locks 0014 on a database with runs: a Tick row per (job, tick), inserted without Now()
    (MongoDB cannot insert an expression): a succeeded tick closed, any other open."""
    url = with_database(mongodb_uri, f"cfsync_backfill_{secrets.token_hex(4)}")
    env = project_env(DATABASE_URL=url)
    try:
        before = manage("migrate", "locks", "0013", "--noinput", env=env, timeout=300)
        assert before.returncode == 0, before.stderr
        step(url, "job_runs")
        after = manage("migrate", "locks", "--noinput", env=env, timeout=300)
        assert after.returncode == 0, after.stderr
        from pymongo import MongoClient

        client = MongoClient(url, serverSelectionTimeoutMS=5000)
        try:
            rows = list(client.get_default_database()["locks_tick"].find({}, {"_id": 0}).sort("tick"))
        finally:
            client.close()
    finally:
        drop_database(url)

    at = datetime(2026, 1, 1, 10)  # naive: as the server stores dates (UTC)
    assert rows == [
        {"job_name": "backfill", "tick": at, "holder": "h2", "status": "succeeded", "until": None}
        | {"claims": 2, "created_at": at + timedelta(seconds=1)},
        {"job_name": "backfill", "tick": at + timedelta(minutes=1), "holder": "h3", "status": "failed"}
        | {"until": datetime(1970, 1, 1), "claims": 1, "created_at": at + timedelta(minutes=1, seconds=1)},
    ]


# --- the operator: pause, resume, run now, status, the tick ledger ---------------------


def test_pause_resume_run_now_status_and_the_ledger(mongo, standin):
    # No early claim (LOCKS_TICK_WINDOW=0): "the slot of now" is then the latest one at or before the
    # database's clock, which the ledger shows, whenever the suite runs (at 23:57 it would claim 00:00).
    env = {"CODEFORCES_API_URL": standin.url, "LOCKS_TICK_WINDOW": "0"}
    answers = step(mongo, "operator", env=env, job="sync_contests")

    assert answers["pause"].startswith("Paused: sync_contests is paused by cli:"), answers["pause"]
    assert answers["paused_run"]["outcome"] == "skipped"
    assert answers["paused_run"]["reason"].endswith(": maintenance")
    assert answers["run_now_paused"].endswith(": maintenance: resume it first; nothing started")
    assert answers["resume"] == "Resumed sync_contests: its next slot runs as usual.\n"
    assert answers["run_now"] == {"changed": True, "detail": ""}
    assert answers["requested_runs"] == ["succeeded"], "the run now did not run, or not once"
    assert answers["scheduled"]["outcome"] == "succeeded"
    assert standin.calls == 2
    [sync] = [row for row in answers["status"] if row["job"] == "sync_contests"]
    shown = (sync["state"], sync["last_status"], sync["paused"], sync["token"])
    assert shown == ("free", "succeeded", False, 2)
    assert sync["tick"] == answers["scheduled"]["tick"]
    # By tick: across a slot boundary the ledger also holds the next slot (not yet run).
    [slot] = [row for row in answers["ticks"] if row["tick"] == answers["scheduled"]["tick"]]
    assert (slot["outcome"], slot["attempts"]) == ("succeeded", 1)
    assert [run["status"] for run in slot["runs"]] == ["succeeded"]  # the forced run claimed no slot
    assert answers["last_success"] == answers["newest_success"] is not None


def test_a_forced_run_that_cannot_read_its_pending_slot_says_it_was_forced(mongo):
    """Under catch_up "all" a forced run reads the oldest slot still to run first; when that read
    fails (here pymongo's, as a dropped connection) it is skipped as unreachable, and says it was forced."""
    result = step(mongo, "forced_unreadable")

    assert (result["outcome"], result["tick"], result["claimed"]) == ("unreachable", None, "forced")
    # django-mongodb-backend's DatabaseError has no text of its own: the reason names pymongo's.
    assert result["reason"] == "database unreachable: DatabaseError: AutoReconnect: connection closed"
    assert [line.split(" holder=")[0] for line in result["logged"]] == ["WARNING: job=hourly tick=forced"]


# --- the lock ---------------------------------------------------------------------


def test_an_expired_lease_is_taken_over_by_the_next_holder(mongo):
    """Lock semantic 4: a holder that died leaves a lease that expires by itself."""
    ttl = 10.0  # a step is a new process (2-3 s on a busy machine): "during" fits in the lease
    before_dead = time.monotonic()
    dead = step(mongo, "acquire", job="expiry", ttl=ttl)  # the process ends, never releasing
    dead_ended = time.monotonic()  # its lease was taken before: it ends before this plus the TTL
    during = step(mongo, "acquire", job="expiry", ttl=ttl)
    during_took = time.monotonic() - before_dead
    time.sleep(max(0.0, dead_ended + ttl + 0.5 - time.monotonic()))  # dead's lease ran out
    after = step(mongo, "acquire", job="expiry", ttl=ttl)

    assert dead["lease"] and dead["token"] == 1
    assert during_took < ttl, f"the two steps took {during_took:.1f} s, longer than the lease"
    assert during["skip"] == "held" and during["holder"] == dead["holder"]
    assert after["lease"] and after["token"] == 2
    assert after["holder"] != dead["holder"]


def test_a_run_settles_earlier_runs_in_one_update(mongo):
    """The Case/When UPDATE of locks.runner._record_start, row by row as on the SQL databases."""
    settled = step(mongo, "settle")

    took_over = "token 5 took over"
    assert settled == {
        "1": ["unknown", "", False],  # before the last committed token: left as it was
        "2": [
            "succeeded",
            f"holder h2 committed its fenced write, then stopped before recording it; {took_over}",
            True,
        ],
        "3": ["failed", "resolved by token 5: the lock row shows its fenced write did not commit", False],
        "4": ["abandoned", f"holder h4 stopped renewing; its lease expired and {took_over}", True],
        "committed": [
            "succeeded",
            "resolved by token 5: the lock row shows its fenced write committed",
            False,
        ],
    }


def test_the_heartbeat_keeps_a_long_job_its_lease(mongo):
    """Lock semantic 5: a job running longer than its TTL keeps the lease."""
    env = project_env(DATABASE_URL=mongo)
    arguments = json.dumps({"job": "heartbeat", "ttl": 2.0, "work": 8.0})
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.test_mongodb", "hold", arguments],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        started = json.loads(holder.stdout.readline())
        time.sleep(4.5)  # over twice the TTL: without renewals the lease would be gone
        contender = step(mongo, "acquire", job="heartbeat", ttl=2.0)
        out, err = holder.communicate(timeout=60)
    finally:
        holder.kill()
    finished = json.loads(out.splitlines()[-1])

    assert contender.get("skip") == "held", (contender, err)
    assert contender["holder"] == started["holder"]
    assert finished["outcome"] == "succeeded", err
    state = step(mongo, "state")
    lock = next(lock for lock in state["locks"] if lock["job_name"] == "heartbeat")
    assert lock["heartbeat_at"] > lock["acquired_at"]
    assert lock["last_status"] == "succeeded"


def test_a_stale_token_can_neither_renew_nor_release(mongo):
    """Lock semantic 7, across processes: after a takeover and after a force
    release, the old holder's token matches nothing."""
    old = step(mongo, "acquire", job="fencing", ttl=1.0)
    time.sleep(1.5)
    new = step(mongo, "acquire", job="fencing", ttl=60.0)
    stale = step(mongo, "renew_release", job="fencing", holder=old["holder"], token=old["token"], ttl=1.0)
    still = step(mongo, "state")

    assert new["token"] == old["token"] + 1
    assert stale == {"renewed": False, "released": False}
    lock = next(lock for lock in still["locks"] if lock["job_name"] == "fencing")
    assert lock["holder"] == new["holder"]
    assert lock["locked_until"] is not None

    forced = step(mongo, "force_release", job="fencing")
    after_force = step(
        mongo, "renew_release", job="fencing", holder=new["holder"], token=new["token"], ttl=60.0
    )

    assert forced == {"was_held": True, "previous_token": new["token"], "token": new["token"] + 1}
    assert after_force == {"renewed": False, "released": False}


def test_a_schedulers_heartbeat_renews_its_workers_leases_in_one_update(mongo):
    """Issue 36, item 4: ``renew_all`` (each lease by its own TTL: a Case/When update) is one
    update command; a lease force-released meanwhile is named lost after a read."""
    beats = step(mongo, "renew_all", jobs=["beat-a", "beat-b"])

    assert beats["renewed"] == {"lost": {}, "commands": {"update": 1}}
    assert beats["until_minus_beat"] == [60.0, 120.0]
    assert beats["after_force"] == {
        "lost": {"beat-b": "lease on beat-b (token 1) was taken over, released or expired"},
        "commands": {"update": 1, "aggregate": 1},
    }


def test_a_repeated_release_gives_an_unused_attempt_back_once(mongo):
    """The Case/When of release(used=False): a repeat (its answer lost) finds the lease released."""
    assert step(mongo, "give_back", job="give-back") == {"attempts": [1, 0, 0], "released": [True, True]}


# --- fencing: the renewal and the write in one transaction (a replica set) -------------


def test_a_stale_holders_fenced_write_is_refused(mongo):
    """Rule 6: a holder whose lease was taken over writes nothing (its renewal matches no row)."""
    result = step(mongo, "fenced_stale", job="stale")

    assert result["second_token"] == result["stale_token"] + 1
    assert result["error"] == (
        f"LockLost: lease on stale (token {result['stale_token']}) was taken over, released or expired"
    )
    assert result["written"] == []


def test_a_fenced_block_that_fails_writes_nothing_not_even_its_renewal(mongo):
    """The renewal (committed token, tick done) and the block's writes are one transaction on a
    replica set: a block that raises after writing is aborted whole, its tick still open."""
    result = step(mongo, "fenced_fails", job="atomic")

    assert result["error"] == "RuntimeError: the body failed after writing"
    assert result["written"] == [], "the block's write outlived its aborted transaction"
    assert result["lock"]["committed_token"] is None
    assert result["lock"]["tick_done"] is False


def test_a_fenced_write_commits_without_a_warning_and_a_later_block_keeps_its_commit(mongo):
    """A fenced block that commits, one with settle=False, then an error: the run succeeded then
    failed, its tick done and its token committed. Was, on a replica set: each COMMIT raised
    "forbidden when an 'atomic' block is active" (MongoDB's transaction committed inside Django's
    atomic, whose on-commit hooks refuse that), logged as a COMMIT with no answer and read back; and
    the second block set the lease back to not committed."""
    result = step(mongo, "fenced_twice", job="twice")

    assert result["outcome"] == "succeeded_then_failed"
    assert (result["lock"]["tick_done"], result["lock"]["committed_token"]) == (True, result["token"])
    assert result["written"] == [f"fenced:twice:{result['token']}"]
    assert result["warnings"] == []


def test_a_takeover_waits_for_the_fenced_transaction(mongo):
    """A holder frozen inside its fenced block (after its renewal and a write, before its commit)
    past its TTL: a contender's compare-and-set cannot take the lease in between, since the renewal
    is part of the open transaction. It takes the lease, if at all, after the holder's commit,
    whose writes are then all in (on a standalone server it would take it at once: check-then-write)."""
    ttl = 1.5
    env = project_env(DATABASE_URL=mongo)
    arguments = json.dumps({"job": "race", "ttl": ttl, "frozen": ttl + 6.0})
    holder = subprocess.Popen(
        [sys.executable, "-m", "tests.test_mongodb", "fenced_slow", arguments],
        cwd=ROOT,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        inside = json.loads(holder.stdout.readline() or "{}")
        assert inside.get("inside"), holder.stderr.read()
        time.sleep(ttl + 0.3)  # the lease ran out while the holder is still inside
        contender = step(mongo, "acquire", job="race", ttl=60.0)
        out, err = holder.communicate(timeout=60)
    finally:
        holder.kill()
    finished = json.loads(out.splitlines()[-1])

    assert finished["committed"], (finished, err)
    assert step(mongo, "throttle_keys")["keys"] == [f"fenced:race:{inside['token']}"]
    if "lease" in contender:
        assert contender["at"] >= finished["done_at"], "the contender took the lease inside the fenced write"
        assert contender["token"] == inside["token"] + 1
    else:
        assert contender["skip"] == "held" and contender["holder"] == inside["holder"], contender


# --- tasks: locks.once, and the outbox of a backend outside the database ---------------


def test_a_task_body_under_once_commits_with_its_done_mark_and_runs_once(mongo):
    """locks.once on a replica set: the body and its outbox row's done mark are one transaction
    (locks.db.write_transaction). A body that raises after writing leaves neither; the next delivery
    commits both, with no warning; one after that does not run the body."""
    result = step(mongo, "once", job="once")

    assert result["answers"] == [
        "RuntimeError: the body failed after writing",
        {"slot": ONCE_SLOT.isoformat()},
        None,
        "LookupError: locks.once: no outbox row of 'once' for slot 2020-01-01T00:00:00+00:00, token 1",
    ]
    assert result["after_first"] == {"written": [], "done": False}, "the failed body's write outlived it"
    assert result["calls"] == 2
    assert result["written"] == ["task:once:2"]
    assert result["done"] is True
    assert result["logged"] == []


def test_a_task_jobs_outbox_row_is_sent_once_and_a_task_delivered_again_does_nothing(mongo, tmp_path):
    """locks.tasks end to end with a backend outside the database: the run writes its slot's outbox
    row in its fenced transaction, then sends it and a row a crash left unsent (oldest first), prunes
    one sent long ago; each task is delivered twice and its body runs once. The slot is done."""
    env = {"OUTSIDE_TASKS": str(tmp_path / "outside.sqlite3"), "TASK_REDELIVER": "1"}
    result = step(mongo, "outbox", env=env)
    slot, token = result["slot"], result["done"]["token"]
    earlier = f"{int(slot[:4]) - 1}{slot[4:]}"

    assert result["done"] == {"outcome": "succeeded", "token": token, "tick": slot}, result["described"]
    assert result["again"] == {
        "outcome": "skipped",
        "reason": f"tick {slot} already done by {result['holder']}",
    }
    assert result["sent"] == [{"slot": earlier, "token": 7}, {"slot": slot, "token": token}]
    rows = result["rows"]
    assert [(row["tick"], row["token"]) for row in rows] == [(earlier, 7), (slot, token)]  # long ago: gone
    assert all(row["task_id"] and row["claimed"] and row["done"] for row in rows), rows
    assert result["stats"]["task"] == rows[1]["task_id"]  # the run names the task it sent
    assert result["written"] == sorted(["task:outbox_mongo:7", f"task:outbox_mongo:{token}"])
    assert result["logged"] == []


def test_forced_outbox_rows_of_one_job_are_not_refused_by_the_unique_index(mongo):
    """A forced run's outbox row has no slot; two of one job are two rows, as on SQL (NULLs are
    distinct there), while a second row of one slot is still refused."""
    result = step(mongo, "forced_outbox_rows")

    assert result == {"forced": 2, "second_slot": "IntegrityError"}, result


def deploy_check(url: str) -> subprocess.CompletedProcess:
    return manage("check", "--deploy", "--database", "default", env=project_env(DATABASE_URL=url))


def test_the_deploy_check_warns_that_a_standalone_server_fences_by_check_then_write(mongo, tmp_path):
    from tests.mongo_server import secantusdb

    with secantusdb(log=tmp_path / "standalone.log", standalone=True) as uri:
        standalone = deploy_check(with_database(uri, "cfsync_check"))
    replica_set = deploy_check(mongo)

    assert "locks.W007" in standalone.stderr + standalone.stdout, standalone.stderr
    assert "MongoDB is a standalone server here, without transactions" in standalone.stderr
    assert "locks.W007" not in replica_set.stderr + replica_set.stdout, replica_set.stderr
    assert "Traceback" not in standalone.stderr + replica_set.stderr


def test_the_lock_refuses_a_database_that_was_not_migrated(mongodb_uri):
    """MongoDB would create the collection on first insert, without the unique
    index the lock relies on: the lock stops instead."""
    bare = with_database(mongodb_uri, f"cfsync_bare_{secrets.token_hex(4)}")
    try:
        result = step(bare, "acquire", job="bare", ttl=1.0)
    finally:
        drop_database(bare)

    assert "lock table locks_synclock is missing: run `python manage.py migrate`" in result["error"]


def test_writes_use_majority_write_concern(mongo):
    result = step(mongo, "write_concern")

    assert result["write_concern"]["w"] == "majority"
    assert 0 < result["write_concern"]["wtimeout"] <= 5000


# --- the driver: one step per process, run as ``python -m tests.test_mongodb`` ---


def _iso(value):
    return value.isoformat() if isinstance(value, datetime) else value


def step_state() -> dict:
    from contests.models import Contest
    from locks.models import JobRun, SyncLock

    rows = Contest.objects.order_by("contest_id").values_list(
        "contest_id", "fingerprint", "name", "start_time", "removed_at", "updated_at"
    )
    digest = hashlib.sha256(json.dumps([[_iso(v) for v in row] for row in rows]).encode()).hexdigest()
    locks = [
        {key: _iso(value) for key, value in row.items() if key != "id"}
        for row in SyncLock.objects.order_by("job_name").values()
    ]
    runs = [
        {"tick": _iso(tick), "status": status}
        for tick, status in JobRun.objects.order_by("-started_at").values_list("tick", "status")
    ]
    return {"contests": len(rows), "contest_digest": digest, "locks": locks, "runs": runs}


def step_acquire(*, job: str, ttl: float) -> dict:
    from locks.lease import LockError, Skip, acquire

    try:
        got = acquire(job=job, tick=None, ttl=timedelta(seconds=ttl))
    except LockError as exc:
        return {"error": str(exc)}
    if isinstance(got, Skip):
        return {"skip": got.reason, "holder": got.holder, "at": time.time()}
    return {"lease": True, "holder": got.holder, "token": got.token, "at": time.time()}


def step_hold(*, job: str, ttl: float, work: float) -> dict:
    from locks.lease import Lease
    from locks.runner import run_locked

    def work_while_holding(lease: Lease) -> dict:
        print(json.dumps({"holder": lease.holder, "token": lease.token}), flush=True)
        time.sleep(work)
        lease.check()
        return {}

    result = run_locked(job=job, tick=None, ttl=timedelta(seconds=ttl), fn=work_while_holding)
    return {"outcome": result.outcome.recorded, "error": result.failure.error}


def step_renew_all(*, jobs: list[str]) -> dict:
    from locks.lease import Held, acquire, renew_all
    from locks.models import SyncLock
    from locks.operator import force_release

    counter = command_counter()
    leases = [acquire(job=job, tick=None, ttl=timedelta(seconds=60 * (n + 1))) for n, job in enumerate(jobs)]
    held = [Held(lease.job, lease.token, lease.ttl, lease.grant.timeline) for lease in leases]
    counter.on = True
    renewed = {"lost": renew_all(held), "commands": counter.take()}
    counter.on = False
    rows = SyncLock.objects.filter(job_name__in=jobs).order_by("job_name")
    until = [
        (until - beat).total_seconds() for until, beat in rows.values_list("locked_until", "heartbeat_at")
    ]
    force_release(job=jobs[1], by="test")
    counter.on = True
    lost = renew_all(held)
    after = {"lost": {held.job: why for held, why in lost.items()}, "commands": counter.take()}
    return {"renewed": renewed, "until_minus_beat": until, "after_force": after}


def step_give_back(*, job: str) -> dict:
    from locks.lease import acquire, release
    from locks.models import SyncLock

    lease = acquire(
        job=job, tick=datetime(2030, 1, 1, tzinfo=UTC), ttl=timedelta(seconds=60), retry_delays=()
    )
    attempts = [SyncLock.objects.get(job_name=job).tick_attempts]
    released = []
    for _repeat in range(2):
        released.append(release(lease=lease, status="failed", used=False))
        attempts.append(SyncLock.objects.get(job_name=job).tick_attempts)
    return {"attempts": attempts, "released": released}


def step_settle() -> dict:
    from locks.lease import Grant, Lease
    from locks.models import JobRun
    from locks.runner import _record_start

    at = datetime(2026, 1, 1, 12, tzinfo=UTC)
    for job, token, status in [("settle", 1, "unknown"), ("settle", 2, "running"), ("settle", 3, "unknown")]:
        JobRun.objects.create(job_name=job, holder=f"h{token}", token=token, started_at=at, status=status)
    JobRun.objects.create(job_name="settle", holder="h4", token=4, started_at=at, status="running")
    JobRun.objects.create(job_name="other", holder="h1", token=1, started_at=at, status="unknown")
    for job, prior in [("settle", 2), ("other", 1)]:
        _record_start(
            Lease(job, "h5", 5, None, timedelta(seconds=60), Grant(at, prior_commit=prior)), requested_by=""
        )
    rows = JobRun.objects.filter(token__lt=5).order_by("job_name", "token")
    return {
        str(run.token) if run.job_name == "settle" else "committed": [
            run.status,
            run.error,
            run.finished_at is not None,
        ]
        for run in rows
    }


def step_renew_release(*, job: str, holder: str, token: int, ttl: float) -> dict:
    from locks.lease import Grant, Lease, LockLost, release, renew

    lease = Lease(
        job=job,
        holder=holder,
        token=token,
        tick=None,
        ttl=timedelta(seconds=ttl),
        grant=Grant(acquired_at=datetime.now(UTC)),
    )
    try:
        renew(lease=lease)
        renewed = True
    except LockLost:
        renewed = False
    return {"renewed": renewed, "released": release(lease=lease, status="succeeded")}


def step_force_release(*, job: str) -> dict:
    from locks.operator import force_release

    released = force_release(job=job, by="tests.test_mongodb")
    return {"was_held": released.changed, "previous_token": released.previous_token, "token": released.token}


def step_prune() -> dict:
    from django.contrib.auth import get_user_model

    from contests.models import Contest, Reminder
    from contests.services import prune_stale_reminders

    now = datetime(2026, 1, 1, 12, tzinfo=UTC)
    user = get_user_model().objects.create_user(f"reminded-{secrets.token_hex(4)}")
    for contest_id, start, phase, removed in [
        (1, now - timedelta(hours=1), "CODING", False),
        (2, now - timedelta(days=2), "FINISHED", False),
        (3, now + timedelta(days=1), "BEFORE", True),
        (4, now + timedelta(days=1), "BEFORE", False),
        (5, now + timedelta(days=3), "BEFORE", False),
    ]:
        contest = Contest.objects.create(
            contest_id=contest_id,
            name=f"Round {contest_id}",
            type="CF",
            phase=phase,
            start_time=start,
            duration=timedelta(hours=2),
            fingerprint="x",
            updated_at=now,
            removed_at=now if removed else None,
        )
        Reminder.objects.create(user=user, contest=contest, remind_at=start - timedelta(minutes=30))
    deleted = prune_stale_reminders(now=now)
    kept = sorted(Reminder.objects.values_list("contest__contest_id", flat=True))
    return {"deleted": deleted, "kept": kept}


def step_reminders(*, count: int) -> dict:
    from tests.contests.reminder_data import due_reminders, make_contest

    contest = make_contest(4242, start=timedelta(hours=2))
    reminders = due_reminders(count, contest=contest, prefix=f"m{secrets.token_hex(3)}")
    return {"addresses": [reminder.user.email for reminder in reminders]}


def step_reminder_state() -> dict:
    from contests.models import Reminder

    rows = Reminder.objects.filter(contest__contest_id=4242)
    return {
        "delivered": rows.filter(delivered_at__isnull=False).count(),
        "attempts": sorted(rows.values_list("attempts", flat=True)),
    }


def step_trigger(*, job: str, addresses: list[str]) -> list[dict]:
    from django.conf import settings
    from django.test import Client

    client, auth = (
        Client(raise_request_exception=False, HTTP_HOST="localhost"),
        f"Bearer {settings.LOCKS_TRIGGER_TOKEN}",
    )
    answers = []
    for address in addresses:
        response = client.post(f"/api/jobs/{job}/run", REMOTE_ADDR=address, HTTP_AUTHORIZATION=auth)
        answers.append({"status": response.status_code, **response.json()})
    return answers


def _lock_row(job: str) -> dict:
    from locks.models import SyncLock

    row = SyncLock.objects.filter(job_name=job).values("committed_token", "tick_done", "token").get()
    return dict(row)


def _throttle_keys(kind: str = "fenced") -> list[str]:
    from locks.models import Throttle

    return sorted(Throttle.objects.filter(key__startswith=f"{kind}:").values_list("key", flat=True))


def _write_marker(job: str, token: int, *, kind: str = "fenced") -> None:
    """A row naming its writer: the write of a fenced block (or, ``kind`` "task", of a task's body)."""
    from locks.models import Throttle

    Throttle.objects.create(key=f"{kind}:{job}:{token}", until=datetime.now(UTC))


def _log_records(*levels: int) -> list[str]:
    """The messages logged at ``levels`` by any logger from now on, "LEVEL: message", as they come."""
    records = []
    handler = logging.Handler()
    handler.emit = lambda record: (
        record.levelno in levels and records.append(f"{record.levelname}: {record.getMessage()}")
    )
    logging.getLogger().addHandler(handler)
    return records


def step_throttle_keys() -> dict:
    return {"keys": _throttle_keys()}


def step_fenced_stale(*, job: str) -> dict:
    from locks.lease import LockLost, acquire, fenced

    stale = acquire(job=job, tick=None, ttl=timedelta(seconds=1))
    time.sleep(1.5)
    second = acquire(job=job, tick=None, ttl=timedelta(seconds=60))
    try:
        with fenced(stale):
            _write_marker(stale.job, stale.token)
        error = ""
    except LockLost as exc:
        error = f"LockLost: {exc}"
    return {
        "stale_token": stale.token,
        "second_token": second.token,
        "error": error,
        "written": _throttle_keys(),
    }


def step_fenced_fails(*, job: str) -> dict:
    from locks.lease import acquire, fenced

    lease = acquire(
        job=job, tick=datetime.now(UTC).replace(second=0, microsecond=0), ttl=timedelta(seconds=60)
    )
    try:
        with fenced(lease):
            _write_marker(lease.job, lease.token)
            raise RuntimeError("the body failed after writing")
    except RuntimeError as exc:
        error = f"RuntimeError: {exc}"
    return {"error": error, "written": _throttle_keys(), "lock": _lock_row(job)}


def step_fenced_twice(*, job: str) -> dict:
    from locks.lease import fenced
    from locks.runner import run_locked

    def body(lease):
        with fenced(lease):
            _write_marker(lease.job, lease.token)
        with fenced(lease, settle=False):
            pass
        raise RuntimeError("after both blocks")

    warnings = _log_records(logging.WARNING)
    tick = datetime.now(UTC).replace(second=0, microsecond=0)
    result = run_locked(job, tick, timedelta(seconds=60), body, retry_delays=(timedelta(seconds=30),))
    written, lock = _throttle_keys(), _lock_row(job)
    return {
        "outcome": result.outcome,
        "token": result.token,
        "written": written,
        "lock": lock,
        "warnings": warnings,
    }


ONCE_SLOT = datetime(2026, 1, 1, tzinfo=UTC)


def step_once(*, job: str) -> dict:
    """Deliveries of a task body under ``locks.once`` for one outbox row: one that raises after its
    write, one that commits, one after that; then one of a slot without a row."""
    from locks import once
    from locks.models import TaskOutbox

    row = TaskOutbox.objects.create(job_name=job, tick=ONCE_SLOT, token=1)
    calls = []

    @once(job)
    def body(*, slot: str | None, token: int) -> dict:
        calls.append(slot)
        _write_marker(job, len(calls), kind="task")
        if len(calls) == 1:
            raise RuntimeError("the body failed after writing")
        return {"slot": slot}

    def deliver(slot: str) -> dict | str | None:
        try:
            return body(slot=slot, token=1)
        except (RuntimeError, LookupError) as exc:
            return f"{type(exc).__name__}: {exc}"

    logged, slot = _log_records(logging.WARNING, logging.ERROR, logging.CRITICAL), ONCE_SLOT.isoformat()
    answers = [deliver(slot)]
    row.refresh_from_db()
    after_first = {"written": _throttle_keys("task"), "done": row.done_at is not None}
    answers += [deliver(slot), deliver(slot), deliver("2020-01-01T00:00:00+00:00")]
    row.refresh_from_db()
    return {
        "answers": answers,
        "calls": len(calls),
        "after_first": after_first,
        "written": _throttle_keys("task"),
        "done": row.done_at is not None,
        "logged": logged,
    }


def outbox_body(*, slot: str | None, token: int) -> dict:
    """The body of ``outbox_task``: a row naming the attempt that sent it."""
    _write_marker("outbox_mongo", token, kind="task")
    return {"slot": slot}


def __getattr__(name: str):
    """``outbox_task``, the task of the job "outbox_mongo" (``step_outbox``), made on first use: under
    ``locks.once``, whose module needs Django set up (this module is imported before, as a script)."""
    if name != "outbox_task":
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    from locks import once

    try:  # Django 6.0 ships the framework; on 5.2 the django-tasks backport does
        from django.tasks import task
    except ImportError:
        from django_tasks import task

    globals()[name] = task(once("outbox_mongo")(outbox_body))
    return globals()[name]


def step_outbox() -> dict:
    """The job "outbox_mongo", its task sent through the outbox to a backend outside the database
    (tests.jobsapp.backends.OutsideBackend: OUTSIDE_TASKS, TASK_REDELIVER), with a row a crash left
    unsent and one sent long ago: its run, then another of its slot."""
    from django.conf import settings
    from django.test import override_settings

    from locks.models import JobRun, TaskOutbox
    from locks.runner import run_job
    from tests.jobsapp.backends import sent_outside

    slot = datetime(datetime.now(UTC).year, 1, 1, tzinfo=UTC)
    earlier, long_ago = (slot.replace(year=slot.year - years) for years in (1, 2))
    TaskOutbox.objects.create(job_name="outbox_mongo", tick=earlier, token=7)
    TaskOutbox.objects.create(
        job_name="outbox_mongo", tick=long_ago, token=3, claimed_at=long_ago, task_id="x"
    )
    entry = {"schedule": "0 0 1 1 *", "task": "tests.test_mongodb.outbox_task", "ttl": 60}
    outside = {"default": {"BACKEND": "tests.jobsapp.backends.OutsideBackend"}}
    logged = _log_records(logging.WARNING, logging.ERROR, logging.CRITICAL)
    with override_settings(TASKS=outside, LOCKS_JOBS={**settings.LOCKS_JOBS, "outbox_mongo": entry}):
        done = run_job(name="outbox_mongo")
        again = run_job(name="outbox_mongo")
    rows = TaskOutbox.objects.filter(job_name="outbox_mongo").order_by("tick")
    return {
        "slot": slot.isoformat(),
        "done": {"outcome": done.outcome.recorded, "token": done.token, "tick": _iso(done.tick)},
        "holder": done.holder,
        "described": done.describe(),
        "again": {"outcome": again.outcome.recorded, "reason": again.reason},
        "stats": JobRun.objects.get(job_name="outbox_mongo", token=done.token).stats,
        "rows": [
            {
                "tick": _iso(row.tick),
                "token": row.token,
                "task_id": row.task_id,
                "claimed": row.claimed_at is not None,
                "done": row.done_at is not None,
            }
            for row in rows
        ],
        "sent": sent_outside(),
        "written": _throttle_keys("task"),
        "logged": logged,
    }


def step_forced_unreadable() -> dict:
    """A forced run of a catch_up "all" job whose read of its pending slot fails: pymongo's
    ``aggregate`` on the lock collection raises as a dropped connection does (the backend turns it
    into Django's ``DatabaseError``)."""
    from unittest import mock

    from django.conf import settings
    from django.db import connection
    from django.test import override_settings
    from pymongo.collection import Collection
    from pymongo.errors import AutoReconnect

    from locks.runner import run_job

    aggregate = Collection.aggregate

    def dropped(collection, *args, **kwargs):
        if collection.name == "locks_synclock":
            raise AutoReconnect("connection closed")
        return aggregate(collection, *args, **kwargs)

    entry = {"schedule": "0 * * * *", "callable": "contests.jobs.sync_contests", "catch_up": "all"}
    connection.ensure_connection()
    logged = _log_records(logging.WARNING)
    with (
        override_settings(LOCKS_JOBS={**settings.LOCKS_JOBS, "hourly": entry}),
        mock.patch.object(Collection, "aggregate", dropped),
    ):
        result = run_job(name="hourly", force=True)
    return {
        "outcome": result.outcome.value,
        "tick": _iso(result.tick),
        "claimed": result.claimed,
        "reason": result.reason,
        "logged": logged,
    }


def step_fenced_slow(*, job: str, ttl: float, frozen: float) -> dict:
    """Inside the fenced block: write, say so, then stay past the TTL before committing."""
    from django.db import Error

    from locks.lease import acquire, fenced

    lease = acquire(job=job, tick=None, ttl=timedelta(seconds=ttl))
    try:
        with fenced(lease):
            _write_marker(lease.job, lease.token)
            print(json.dumps({"inside": True, "holder": lease.holder, "token": lease.token}), flush=True)
            time.sleep(frozen)
    except Error as exc:
        return {"committed": False, "error": str(exc), "done_at": time.time()}
    return {"committed": lease.committed, "error": "", "done_at": time.time()}


def step_operator(*, job: str) -> dict:
    """Pause, a run while paused, run now while paused, resume, run now, then ``locks status``
    and ``locks ticks``: the operator's paths, each through its command or service."""
    from io import StringIO

    from django.core.management import call_command

    from locks.models import JobRun
    from locks.operator import run_now
    from locks.runner import run_job
    from locks.status import jobs_health

    def locks(*args: str) -> str:
        out = StringIO()
        call_command("locks", *args, stdout=out)
        return out.getvalue()

    by = "admin:mongo-operator"
    answers = {"pause": locks("pause", job, "--note", "maintenance")}
    paused = run_job(name=job, force=True)
    answers["paused_run"] = {"outcome": paused.outcome.recorded, "reason": paused.reason}
    answers["run_now_paused"] = run_now(job=job, by=by).detail
    answers["resume"] = locks("resume", job)
    started = run_now(job=job, by=by)
    answers["run_now"] = {"changed": started.changed, "detail": started.detail}
    runs = JobRun.objects.filter(job_name=job, requested_by=by)
    deadline = time.monotonic() + 60
    while not runs.exclude(status="running").exists() and time.monotonic() < deadline:
        time.sleep(0.2)
    answers["requested_runs"] = list(runs.values_list("status", flat=True))
    scheduled = run_job(name=job)  # the slot of now, as cron or the scheduler runs it
    answers["scheduled"] = {"outcome": scheduled.outcome.recorded, "tick": _iso(scheduled.tick)}
    answers["status"] = json.loads(locks("status", "--json"))
    answers["ticks"] = json.loads(locks("ticks", job, "--json", "--last", "3"))
    # /healthz's, /metrics' and check_jobs' last success: a subquery of the lock row's query
    answers["last_success"] = _iso(jobs_health(jobs=[job])[job].last_success_at)
    answers["newest_success"] = _iso(
        runs.model.objects.filter(job_name=job, status="succeeded").latest("finished_at").finished_at
    )
    return answers


def step_write_concern() -> dict:
    from django.db import connection

    connection.ensure_connection()
    return {"write_concern": connection.connection.write_concern.document}


def command_counter():
    """A counter of the commands this process sends (pymongo's command monitoring), by name, while
    its ``on`` is set; registered before the backend's client is made (the step's first query)."""
    from collections import Counter

    from pymongo import monitoring

    class CommandCounter(monitoring.CommandListener):
        def __init__(self) -> None:
            self.counts, self.on = Counter(), False

        def started(self, event) -> None:
            if self.on and event.command_name != "buildinfo":  # the server's version, once a connection
                self.counts[event.command_name] += 1

        def succeeded(self, event) -> None:
            pass

        def failed(self, event) -> None:
            pass

        def take(self) -> dict[str, int]:
            counts, self.counts = dict(self.counts), Counter()
            return counts

    counter = CommandCounter()
    monitoring.register(counter)
    return counter


def _asks(count: int, tick: str) -> list:
    """``count`` jobs' asks for ``tick``, 60 s each."""
    return [(f"job{index:02}", datetime.fromisoformat(tick), timedelta(seconds=60)) for index in range(count)]


def step_tick_claims(*, asks: int) -> dict:
    from django.db import IntegrityError

    from locks.models import Tick, database_now

    counter = command_counter()
    now = database_now().replace(microsecond=0)  # a slot of now: as the scheduler claims
    counter.on = True
    claims, commands, won = _asks(asks, now.isoformat()), {}, {}
    for holder in ["a", "b", "c"]:
        won[holder] = sorted(Tick.objects.claim(claims, holder=holder))
        commands[holder] = counter.take()
    again = sorted(Tick.objects.claim(claims, holder="a"))
    commands["again"] = counter.take()
    counter.on = False
    job, tick = claims[0][0], claims[0][1]
    first = Tick.objects.get(job_name=job, tick=tick).created_at
    rows = Tick.objects.filter(job_name__startswith="job")
    summary = {
        "count": rows.count(),
        "holders": sorted(set(rows.values_list("holder", flat=True))),
        "claims": sorted(set(rows.values_list("claims", flat=True))),
    }
    try:
        Tick.objects.create(job_name=job, tick=tick, holder="d", until=tick, created_at=tick)
        duplicate = "inserted"
    except IntegrityError as exc:
        duplicate = f"{type(exc).__name__}: {'E11000 duplicate key error' in str(exc.__cause__)}"

    short = [("expiring", tick, timedelta(seconds=1))]
    expiry = {"a": sorted(Tick.objects.claim(short, holder="a"))}
    expiry["b_during"] = sorted(Tick.objects.claim(short, holder="b"))
    time.sleep(1.5)  # a's claim ran out (by the database clock)
    expiry["b_after"] = sorted(Tick.objects.claim(short, holder="b"))
    expiry["claims"] = Tick.objects.get(job_name="expiring").claims

    Tick.objects.close([(job, tick, "succeeded", False), ("job01", tick, "failed", True)], holder="a")
    closed = {
        "b_after_final": sorted(Tick.objects.claim(claims[:1], holder="b")),
        "c_after_again": sorted(Tick.objects.claim(claims[1:2], holder="c")),
        "job01_claims": Tick.objects.get(job_name="job01").claims,
    }
    return {
        "won": won,
        "again": again,
        "rows": summary,
        "duplicate": duplicate,
        "first": {
            "created_at": _iso(first),
            "created_after_again": _iso(Tick.objects.get(job_name=job, tick=tick).created_at),
            "age": (database_now() - first).total_seconds(),
        },
        "expiry": expiry,
        "closed": closed,
        "commands": commands,
    }


def step_tick_race(*, asks: int, tick: str, start: float) -> dict:
    from django.db import connection

    from locks.lease import make_holder
    from locks.models import Tick

    counter = command_counter()
    connection.ensure_connection()
    Tick.objects.claim([("warm-up", datetime(2026, 1, 1, tzinfo=UTC), timedelta(0))], holder="warm-up")
    holder = make_holder()
    time.sleep(max(0.0, start - time.time()))
    counter.on = True
    won = sorted(Tick.objects.claim(_asks(asks, tick), holder=holder))
    return {"holder": holder, "won": won, "commands": counter.take()}


def step_tick_rows() -> list[dict]:
    from locks.models import Tick

    return list(Tick.objects.filter(job_name__startswith="job").values("job_name", "holder", "claims"))


def step_tick_claim_bare() -> dict:
    from django.db import ProgrammingError

    from locks.models import Tick

    counter = command_counter()
    counter.on = True
    errors = []
    for _ in range(2):
        try:
            Tick.objects.claim(_asks(1, "2026-01-01T10:00:00+00:00"), holder="a")
        except ProgrammingError as exc:
            errors.append(f"ProgrammingError: {exc}")
    return {"errors": errors, "commands": counter.take()}


def step_job_runs() -> dict:
    """Runs of two ticks: the first failed then succeeded, the second failed."""
    from locks.models import JobRun

    at = datetime(2026, 1, 1, 10, tzinfo=UTC)
    for token, tick, started, status in [
        (1, at, at + timedelta(seconds=1), "failed"),
        (2, at, at + timedelta(seconds=30), "succeeded"),
        (3, at + timedelta(minutes=1), at + timedelta(minutes=1, seconds=1), "failed"),
    ]:
        JobRun.objects.create(
            job_name="backfill", holder=f"h{token}", token=token, tick=tick, started_at=started, status=status
        )
    return {}


def step_forced_outbox_rows() -> dict:
    from django.db import IntegrityError, transaction

    from locks.models import TaskOutbox

    for token in (1, 2):
        TaskOutbox.objects.create(job_name="forced_outbox", tick=None, token=token)
    TaskOutbox.objects.create(job_name="forced_outbox", tick=ONCE_SLOT, token=3)
    try:
        with transaction.atomic():
            TaskOutbox.objects.create(job_name="forced_outbox", tick=ONCE_SLOT, token=4)
    except IntegrityError as exc:
        second = type(exc).__name__
    else:
        second = "accepted"
    return {
        "forced": TaskOutbox.objects.filter(job_name="forced_outbox", tick=None).count(),
        "second_slot": second,
    }


def main() -> None:
    import django

    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "config.settings")
    django.setup()
    name, arguments = sys.argv[1], json.loads(sys.argv[2] if len(sys.argv) > 2 else "{}")
    print(json.dumps(globals()[f"step_{name}"](**arguments)), flush=True)


if __name__ == "__main__":
    main()
