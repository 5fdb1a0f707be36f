"""The admin's controls of a job (issue 19, items 1 to 3 and 6): pause and resume, run now in a
background process, the tick ledger's strip and table, who asked for a run, the traceback of
an unexpected failure. Django's test client; the run-now process is a real one."""

from __future__ import annotations

import logging
import re
import time
from datetime import timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.contrib.auth.models import Permission
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from locks.db import TRACEBACK_LIMIT, traceback_text
from locks.lease import acquire
from locks.models import JobRun, Outcome, SyncLock, database_now
from locks.operator import pause_job
from locks.runner import run_job, run_locked
from locks.schedule import Schedule
from tests.locks.conftest import TICK, register, reschedule, wait_for

pytestmark = pytest.mark.django_db
LIST_URL = reverse("admin:locks_synclock_changelist")


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def alice(client, django_user_model):
    user = django_user_model.objects.create_superuser("alice", "alice@example.com", "pw")
    client.force_login(user)
    return client


@pytest.fixture
def viewer(client, django_user_model):
    """Staff who may see locks and runs, and nothing else."""
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="locks", codename__in=["view_synclock", "view_jobrun"]
        )
    )
    client.force_login(user)
    return user


def url(name: str, job: str = "record") -> str:
    return reverse(f"admin:locks_synclock_{name}", args=[SyncLock.objects.get(job_name=job).pk])


def messages_of(response) -> list[str]:
    return [str(message) for message in response.context["messages"]]


# --- pause and resume ----------------------------------------------------------------------


def test_pause_from_the_lock_page_with_a_note_is_logged_and_resume_undoes_it(alice, caplog):
    caplog.set_level(logging.WARNING, logger="locks.api")
    SyncLock.objects.create(job_name="record")
    page = alice.get(url("change")).content.decode()
    assert f'href="{url("pause")}" id="pause"' in page and 'id="run-now"' in page

    form = alice.get(url("pause"))
    assert 'name="note"' in form.content.decode() and "not the HTTP trigger" in form.content.decode()
    response = alice.post(url("pause"), {"note": "mail relay down"}, follow=True)

    assert messages_of(response)[0].startswith("Paused record: no copy runs it")
    lock = SyncLock.objects.get(job_name="record")
    assert (lock.paused_by, lock.paused_note) == ("admin:alice", "mail relay down")
    entry = LogEntry.objects.get()
    assert (entry.user.username, entry.get_change_message()) == ("alice", "Paused: mail relay down")
    assert any("job=record paused by admin:alice" in message for message in caplog.messages)
    page = alice.get(url("change")).content.decode()
    assert "paused by admin:alice since " in page and 'id="resume"' in page

    assert alice.get(url("resume")).status_code == 405  # a write: POST only
    response = alice.post(url("resume"), follow=True)
    assert messages_of(response) == ["Resumed record: its next slot runs as usual."]
    assert SyncLock.objects.get(job_name="record").paused_at is None
    assert [entry.get_change_message() for entry in LogEntry.objects.order_by("pk")] == [
        "Paused: mail relay down",
        "Resumed.",
    ]


def test_the_pause_action_asks_for_a_note_then_pauses_every_selected_job(alice):
    SyncLock.objects.create(job_name="record")
    SyncLock.objects.create(job_name="write_slot")
    picked = list(SyncLock.objects.values_list("pk", flat=True))
    confirm = alice.post(LIST_URL, {"action": "pause_jobs", "_selected_action": picked})
    assert 'id="confirm-pause"' in confirm.content.decode()
    assert not SyncLock.objects.filter(paused_at__isnull=False).exists()  # nothing yet

    alice.post(
        LIST_URL, {"action": "pause_jobs", "_selected_action": picked, "post": "yes", "note": "freeze"}
    )
    assert set(SyncLock.objects.values_list("paused_note", flat=True)) == {"freeze"}
    alice.post(LIST_URL, {"action": "resume_jobs", "_selected_action": picked})
    assert not SyncLock.objects.filter(paused_at__isnull=False).exists()


def test_a_lock_of_a_job_no_longer_registered_cannot_be_paused(alice):
    SyncLock.objects.create(job_name="retired")
    response = alice.post(url("pause", "retired"), {"note": "x"}, follow=True)
    assert messages_of(response) == [
        "no job named 'retired' in LOCKS_JOBS (registered: write_slot, record, refuse, linger, slow_write, check_jobs)"
    ]
    assert SyncLock.objects.get().paused_at is None and not LogEntry.objects.exists()


def test_without_the_permissions_there_are_no_controls_and_their_urls_answer_403(client, viewer):
    SyncLock.objects.create(job_name="record")
    page = client.get(url("change")).content.decode()
    assert 'id="pause"' not in page and 'id="run-now"' not in page
    listing = client.get(LIST_URL).content.decode()
    assert 'value="run_now"' not in listing and 'value="pause_jobs"' not in listing
    for name in ("pause", "resume", "run_now"):
        assert client.post(url(name), {"note": "x"}).status_code == 403, name
    viewer.user_permissions.add(Permission.objects.get(codename="pause_synclock"))
    assert client.post(url("pause"), {"note": "x"}).status_code == 302
    assert SyncLock.objects.get().paused_by == "admin:viewer"
    assert client.post(url("run_now")).status_code == 403  # pausing does not grant running


# --- run now ---------------------------------------------------------------------------


def test_run_now_of_a_paused_or_held_job_starts_nothing_and_says_why(alice):
    pause_job(job="record", by="cli:bob", note="n")
    response = alice.post(url("run_now"), follow=True)
    [message] = messages_of(response)
    assert message.startswith("record is paused by cli:bob since ") and message.endswith("nothing started.")
    acquire(job="write_slot", tick=None, ttl=timedelta(minutes=5), holder="web-1:1:abc")
    response = alice.post(url("run_now", "write_slot"), follow=True)
    [message] = messages_of(response)
    assert message.startswith("write_slot is running now (held by web-1:1:abc until ")
    assert not JobRun.objects.exists() and not LogEntry.objects.exists()


@pytest.mark.slow
def test_run_now_answers_at_once_and_the_run_finishes_in_the_background(
    client, django_user_model, settings, db_url, tmp_path, monkeypatch
):
    """The job blocks until the test lets it go: the answer came while it was still running."""
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    client.force_login(django_user_model.objects.create_superuser("alice", "a@example.com", "pw"))
    gate = tmp_path / "release"
    monkeypatch.setenv("DATABASE_URL", db_url)  # the background process reaches the test database
    monkeypatch.setenv("RELEASE_FILE", str(gate))
    register(
        settings,
        wait_for_release={"schedule": "0 0 1 1 *", "callable": "tests.jobsapp.jobs.wait_for_release"},
    )
    SyncLock.objects.create(job_name="wait_for_release")

    response = client.post(url("run_now", "wait_for_release"), follow=True)

    [message] = messages_of(response)
    assert re.fullmatch(
        r"Started a run of wait_for_release in the background \(pid \d+\): it runs under the lease; "
        r"its outcome appears in the run history\.",
        message,
    ), message
    assert not gate.exists()  # so the job cannot have finished: it is still waiting, or not yet started
    runs = JobRun.objects.filter(job_name="wait_for_release")
    wait_for(runs.filter(status=Outcome.RUNNING).exists, timeout=60, what="the background run to start")
    gate.touch()
    wait_for(runs.exclude(status=Outcome.RUNNING).exists, timeout=60, what="the background run to finish")
    run = runs.get()
    assert (run.status, run.tick, run.requested_by, run.stats) == (
        Outcome.SUCCEEDED,
        None,
        "admin:alice",
        {"released": 1},
    )
    assert "Run now requested (background process " in LogEntry.objects.get().get_change_message()
    history = client.get(url("change", "wait_for_release")).content.decode()
    assert "admin:alice" in history


@pytest.mark.slow
def test_two_run_now_clicks_50_ms_apart_start_one_run(
    client, django_user_model, settings, db_url, tmp_path, monkeypatch
):
    """The admin checked "held / paused" and then acted: two quick clicks started two --force
    processes and the job ran twice, one after the other (issue 25)."""
    client.force_login(django_user_model.objects.create_superuser("alice", "a@example.com", "pw"))
    gate = tmp_path / "release"
    monkeypatch.setenv("DATABASE_URL", db_url)
    monkeypatch.setenv("RELEASE_FILE", str(gate))
    register(
        settings,
        wait_for_release={"schedule": "0 0 1 1 *", "callable": "tests.jobsapp.jobs.wait_for_release"},
    )
    SyncLock.objects.create(job_name="wait_for_release")

    first = messages_of(client.post(url("run_now", "wait_for_release"), follow=True))
    time.sleep(0.05)
    second = messages_of(client.post(url("run_now", "wait_for_release"), follow=True))

    assert first[0].startswith("Started a run of wait_for_release in the background")
    assert len(second) == 1 and second[0].endswith("nothing started."), second
    assert "was requested by admin:alice at " in second[0] or "is running now" in second[0], second
    runs = JobRun.objects.filter(job_name="wait_for_release")
    wait_for(runs.exists, timeout=60, what="the background run to start")
    gate.touch()
    wait_for(lambda: not runs.filter(status=Outcome.RUNNING).exists(), timeout=60, what="the run to finish")
    wait_for(
        lambda: SyncLock.objects.get(job_name="wait_for_release").run_requested_at is None,
        timeout=30,
        what="the request to end",
    )
    assert list(runs.values_list("status", "requested_by")) == [("succeeded", "admin:alice")]
    third = messages_of(client.post(url("run_now", "wait_for_release"), follow=True))
    assert third[0].startswith("Started a run")  # the request ended with its run: another may start
    wait_for(lambda: runs.filter(status=Outcome.SUCCEEDED).count() == 2, timeout=60, what="the third run")


def test_a_run_now_whose_process_cannot_start_leaves_a_failed_run_with_its_error(alice, monkeypatch):
    """It said "Started" and recorded nothing before."""
    SyncLock.objects.create(job_name="record")
    monkeypatch.setattr(
        "locks.operator.run_now_command", lambda **kwargs: ["/nonexistent/python", "-m", "django"]
    )

    [message] = messages_of(alice.post(url("run_now"), follow=True))

    assert message.startswith("run now requested by admin:alice could not start: FileNotFoundError: ")
    run = JobRun.objects.get(job_name="record")
    assert (run.status, run.requested_by) == ("failed", "admin:alice")
    assert run.error == message.removesuffix(".")
    assert SyncLock.objects.get(job_name="record").run_requested_at is None  # the next click may try again
    assert not LogEntry.objects.exists()


# --- the ledger in the admin ----------------------------------------------------------------


def test_the_list_shows_a_strip_of_one_cell_per_slot_and_the_page_the_whole_ledger(alice, settings):
    reschedule(settings, "record", "0 * * * *")
    settings.LOCKS_LEDGER_SLOTS = 6
    ticks = Schedule("0 * * * *").previous(database_now(), 6)
    for token, (tick, status) in enumerate([(ticks[1], Outcome.SUCCEEDED), (ticks[2], Outcome.FAILED)], 1):
        JobRun.objects.create(
            job_name="record",
            tick=tick,
            holder="h:1:a",
            token=token,
            status=status,
            started_at=tick,
            requested_by="cron",
        )
    # The job existed before its oldest slot shown: the ledger starts with its lock row (issue 27).
    SyncLock.objects.create(job_name="record", created_at=ticks[-1] - timedelta(minutes=1))

    listing = alice.get(LIST_URL).content.decode()
    [strip] = re.findall(r'<span class="tick-strip" data-job="record">(.*?)</span></td>', listing)
    cells = re.findall(r'data-outcome="(\w+)" data-failover="no" title="([^"]+)"', strip)
    assert [outcome for outcome, _title in cells] == [
        "missed",
        "missed",
        "missed",
        "failed",
        "succeeded",
        "pending",
    ]
    assert cells[-2][1] == f"{ticks[1]:%Y-%m-%d %H:%M} UTC succeeded"  # newest on the right
    assert cells[3][1] == f"{ticks[2]:%Y-%m-%d %H:%M} UTC failed (1 attempt)"

    page = alice.get(url("change")).content.decode()
    assert "Tick ledger: the last 6 slots" in page
    assert "failed (token 2, cron)" in page
    assert "database failover" not in page


def test_a_slot_a_failover_touched_is_marked_in_the_strip_and_the_ledger(alice, settings):
    """Rule 16: a run lost with the old primary, or the rerun after a failover, marks its slot."""
    reschedule(settings, "record", "0 * * * *")
    settings.LOCKS_LEDGER_SLOTS = 3
    ticks = Schedule("0 * * * *").previous(database_now(), 3)
    SyncLock.objects.create(job_name="record", created_at=ticks[-1] - timedelta(minutes=1))
    failover = "the database failed over since token 1 was granted on timeline 1 (now timeline 2)"
    for token, tick, note in [(1, ticks[2], ""), (2, ticks[1], failover)]:
        JobRun.objects.create(
            job_name="record",
            tick=tick,
            holder="h:1:a",
            token=token,
            timeline=1 + (token == 2),
            status=Outcome.SUCCEEDED,
            started_at=tick,
            failover=note,
        )

    listing = alice.get(LIST_URL).content.decode()
    [strip] = re.findall(r'<span class="tick-strip" data-job="record">(.*?)</span></td>', listing)
    marks = re.findall(r'data-outcome="(\w+)" data-failover="(\w+)" title="([^"]+)"', strip)
    assert [(outcome, mark) for outcome, mark, _title in marks] == [
        ("succeeded", "no"),
        ("succeeded", "yes"),
        ("pending", "no"),
    ]
    assert marks[1][2].endswith("(a database failover: it may have run on the old primary too)")

    page = alice.get(url("change")).content.decode()
    assert page.count("database failover: this slot may have run on the old primary too") == 1
    assert "succeeded (token 2/2)" in page  # the pair (timeline, token)


@pytest.mark.parametrize("runs", [10, 1000])
def test_the_list_with_its_strips_costs_the_same_queries_whatever_the_runs(
    alice, runs, django_assert_max_num_queries
):
    ticks = Schedule("*/5 * * * *").previous(database_now(), 48)
    JobRun.objects.bulk_create(
        JobRun(
            job_name=("record", "write_slot")[n % 2],
            tick=ticks[n % 48],
            holder="h",
            token=n,
            status="failed",
            started_at=ticks[n % 48],
        )
        for n in range(runs)
    )
    for name in ("record", "write_slot", "refuse"):
        SyncLock.objects.create(job_name=name)
    with CaptureQueriesContext(connection) as queries:
        assert alice.get(LIST_URL).status_code == 200
    assert len(queries) <= 12, len(queries)
    with django_assert_max_num_queries(len(queries)):  # the same whatever the number of runs
        alice.get(LIST_URL)


# --- tracebacks ------------------------------------------------------------------------------


def test_an_unexpected_failure_keeps_its_traceback_on_its_run_and_its_page(alice):
    def bug(lease):
        {}["missing"]

    run_locked(job="record", tick=TICK, ttl=timedelta(minutes=1), fn=bug)
    run = JobRun.objects.get()
    assert run.error == "KeyError: 'missing'"
    assert run.traceback.startswith("Traceback (most recent call last):")
    assert '{}["missing"]' in run.traceback and run.traceback.endswith("KeyError: 'missing'")
    page = alice.get(reverse("admin:locks_jobrun_change", args=[run.pk])).content.decode()
    assert '<pre class="run-traceback">Traceback (most recent call last):' in page


def test_an_expected_failure_keeps_its_one_line_and_no_traceback():
    assert run_job(name="refuse", force=True).outcome == "failed_expected"
    run = JobRun.objects.get()
    assert (run.error, run.traceback, run.requested_by) == ("nothing to record today", "", "")


def test_a_long_traceback_keeps_its_end_within_the_bound():
    def failing(n):
        try:
            if n:
                failing(n - 1)
            else:
                raise RuntimeError("the bottom")
        except Exception as exc:
            raise ValueError(f"layer {n} " + "x" * 100) from exc

    try:
        failing(60)  # sixty chained exceptions, each with its own frames: far over 10 kB
    except ValueError as exc:
        text = traceback_text(exc)
    assert len(text) <= TRACEBACK_LIMIT + 40
    assert re.match(r"… \(\d+ characters cut\)\n", text), text[:80]
    assert text.endswith("ValueError: layer 60 " + "x" * 100)  # the end is kept: where it was raised


def test_a_control_url_whose_id_is_not_a_key_answers_the_admins_missing_object_redirect(client, viewer):
    """Issue 35, item 16: the lookup went through ``filter(pk=...)``, whose ``ValueError`` was a 500
    for any staff user; the model's pk field decides what a key looks like (an ObjectId on MongoDB)."""
    for segment in ("pause", "resume", "run_now", "force-release"):
        response = client.post(f"{LIST_URL}not-a-number/{segment}/")
        assert (response.status_code, response["Location"]) == (302, reverse("admin:index")), segment
