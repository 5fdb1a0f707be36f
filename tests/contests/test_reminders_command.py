"""`manage.py send_reminders` as real processes: exactly one email per due reminder,
even with concurrent runs and a run SIGKILLed between claim, send and record; every
EMAIL_URL scheme against a real SMTP server on loopback (tests/smtp_standin.py)."""

from __future__ import annotations

import email
import json
import signal
import subprocess
import sys
import textwrap
import threading
import time
from datetime import timedelta
from email.message import Message
from pathlib import Path

import pytest
from django.db.models.functions import Now
from django.utils import timezone

from contests.models import Reminder
from contests.reminders import RECORD_EVERY
from locks.models import JobRun
from locks.operator import force_release
from tests.conftest import ROOT, manage, project_env, spawn
from tests.contests.reminder_data import (
    due_reminders,
    make_contest,
    make_reminder,
    make_user,
    many_due_reminders,
)
from tests.smtp_standin import self_signed, smtp_standin
from tests.test_mongodb_settings import closed_port

pytestmark = pytest.mark.slow
FILE_BACKEND = "django.core.mail.backends.filebased.EmailBackend"
SEPARATOR = "\n" + "-" * 79 + "\n"  # what the file backend writes after each message


@pytest.fixture
def outbox(tmp_path) -> Path:
    path = tmp_path / "mail"
    path.mkdir()
    return path


@pytest.fixture
def env(db_url, outbox):
    return project_env(DATABASE_URL=db_url, EMAIL_BACKEND=FILE_BACKEND, EMAIL_FILE_PATH=str(outbox))


@pytest.fixture
def soon(transactional_db):
    return make_contest(1843, start=timedelta(hours=2), name="Codeforces Round 999 (Div. 2)")


def messages(outbox: Path) -> list[Message]:
    """Every message the file backend wrote, from every process's files."""
    found = []
    for path in sorted(outbox.iterdir()):
        for chunk in path.read_text().split(SEPARATOR):
            if chunk.strip():
                found.append(email.message_from_string(chunk))
    return found


def recipients(outbox: Path) -> list[str]:
    return sorted(message["To"] for message in messages(outbox))


def lock_lines(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if " locks.api " in line]


def test_four_runs_a_forced_one_and_a_scheduler_send_each_due_reminder_exactly_once(env, outbox, soon):
    due = due_reminders(24, contest=soon)
    make_reminder(make_user("later"), soon, at=timedelta(minutes=30))  # not yet due
    started = make_contest(2, start=-timedelta(minutes=5))
    removed = make_contest(3, start=timedelta(days=1), removed_at=timezone.now())
    make_reminder(make_user("stale1"), started, at=-timedelta(hours=1))
    make_reminder(make_user("stale2"), removed, at=-timedelta(minutes=1))
    nobody = make_reminder(make_user("nomail", email=""), soon, at=-timedelta(minutes=1))

    scheduler = spawn(["manage.py", "run_scheduler", "send_reminders"], env=env)
    commands = [["send_reminders"]] * 4 + [["send_reminders", "--force"]]
    procs = [spawn(["manage.py", *command], env=env) for command in commands]
    outputs = [proc.communicate(timeout=120) for proc in procs]
    # The scheduler asks for the current minute on start; once it has said so, stop it.
    deadline = time.monotonic() + 60
    while not JobRun.objects.filter(job_name="send_reminders").count() >= 2 and time.monotonic() < deadline:
        time.sleep(0.1)
    time.sleep(1)
    scheduler.send_signal(signal.SIGTERM)
    _, scheduled = scheduler.communicate(timeout=60)
    assert scheduler.returncode == 0, scheduled
    assert "job=send_reminders tick=" in scheduled and "Traceback" not in scheduled

    assert [proc.returncode for proc in procs] == [0] * 5, outputs
    assert recipients(outbox) == sorted(f"user{n}@example.com" for n in range(24))
    assert (
        Reminder.objects.filter(pk__in=[r.pk for r in due], delivered_at__isnull=False, attempts=1).count()
        == 24
    )
    for _, stderr in outputs:
        assert len(lock_lines(stderr)) == 1, stderr  # one line per run
        assert "Traceback" not in stderr
    runs = list(JobRun.objects.filter(job_name="send_reminders", status="succeeded"))
    assert sum(run.stats["sent"] for run in runs) == 24
    assert sum(run.stats["skipped"] for run in runs) == 1
    assert sum(run.stats["failed"] for run in runs) == 0
    nobody.refresh_from_db()
    assert (nobody.delivered_at, nobody.last_error) == (None, "not sent: the user has no email address")
    assert Reminder.objects.filter(delivered_at__isnull=False).count() == 24  # nothing else was sent


WORKER = textwrap.dedent(
    """
    import json, sys
    import django
    django.setup()
    from contests.reminders import deliver_due_reminders

    print("READY", flush=True)
    sys.stdin.readline()
    print(json.dumps(deliver_due_reminders().as_dict()), flush=True)
    """
)


def test_two_concurrent_runs_over_5000_reminders_send_each_exactly_once(db_url, soon):
    """No lease here: two services start claiming the same 5,000 due reminders at the
    same moment, in batches of 100; only the claims decide who sends each. Counted at
    the SMTP server, by recipient (one per reminder)."""
    many_due_reminders(5000, contest=soon)
    with smtp_standin(keep=False) as server:
        env = project_env(
            DATABASE_URL=db_url,
            DJANGO_SETTINGS_MODULE="config.settings",
            EMAIL_URL=f"smtp://127.0.0.1:{server.port}",
            SEND_REMINDERS_BATCH="100",
        )
        procs = [
            subprocess.Popen(
                [sys.executable, "-c", WORKER],
                cwd=ROOT,
                env=env,
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
            for _ in range(2)
        ]
        for proc in procs:
            assert proc.stdout.readline() == "READY\n", proc.stderr.read()
        for proc in procs:
            proc.stdin.write("go\n")
            proc.stdin.flush()
        outputs = [proc.communicate(timeout=240) for proc in procs]

    assert [proc.returncode for proc in procs] == [0, 0], outputs
    stats = [json.loads(out) for out, _ in outputs]
    assert sum(s["sent"] for s in stats) == sum(s["due"] for s in stats) == 5000
    assert len(server.received) == 5000
    assert set(server.received.values()) == {1}
    assert Reminder.objects.filter(delivered_at__isnull=False, attempts=1).count() == 5000


def test_one_log_line_with_the_counts_and_the_counts_on_the_run(env, soon):
    make_reminder(make_user("alice"), soon, at=-timedelta(minutes=1))
    make_reminder(make_user("bob", email=""), soon, at=-timedelta(minutes=1))

    done = manage("send_reminders", env=env)

    assert done.returncode == 0, done.stderr
    [line] = lock_lines(done.stderr)
    assert " INFO locks.api job=send_reminders tick=" in line
    assert " outcome=succeeded " in line
    assert " due=2 sent=1 failed=0 uncertain=0 skipped=1 duration=" in line
    run = JobRun.objects.get(job_name="send_reminders")
    assert run.stats == {"due": 2, "sent": 1, "failed": 0, "uncertain": 0, "skipped": 1}


def test_an_unreachable_smtp_server_fails_the_run_and_the_next_run_delivers(db_url, env, outbox, soon):
    reminder = make_reminder(make_user("alice"), soon, at=-timedelta(minutes=1))
    smtp_env = project_env(DATABASE_URL=db_url, EMAIL_URL=f"smtp://127.0.0.1:{closed_port()}")

    failed = manage("send_reminders", env=smtp_env)

    assert failed.returncode == 1
    assert "Traceback" not in failed.stderr
    [line] = lock_lines(failed.stderr)
    assert " ERROR locks.api job=send_reminders " in line
    assert "outcome=failed" in line
    assert "error=not sent yet: the mail server is unreachable: ConnectionRefusedError" in line
    reminder.refresh_from_db()
    assert reminder.last_error.startswith(
        "not sent yet: the mail server is unreachable: ConnectionRefusedError"
    )
    assert (reminder.attempts, reminder.delivered_at, reminder.claimed_until) == (0, None, None)

    # --force: this test is about the reminder, not about when a failed tick may be claimed again.
    retried = manage("send_reminders", "--force", env=env)

    assert retried.returncode == 0, retried.stderr
    assert "sent=1" in lock_lines(retried.stderr)[0]
    assert recipients(outbox) == ["alice@example.com"]
    reminder.refresh_from_db()
    assert (reminder.attempts, reminder.delivered_at is not None) == (1, True)


def test_with_nothing_due_a_run_asks_no_mail_server_and_succeeds_even_while_it_is_down(
    db_url, client, settings, soon
):
    """Issue 28, item 1: a site with nothing to send never learns that its mail server is
    down. The run succeeds with sent=0 and opens no connection (counted at a live stand-in);
    /healthz stays 200 and the HTTP trigger answers 200, where they were 503 and 502."""
    make_reminder(make_user("later"), soon, at=timedelta(minutes=30))  # not yet due
    make_reminder(make_user("done"), soon, at=-timedelta(minutes=5), delivered_at=timezone.now())
    down = project_env(DATABASE_URL=db_url, EMAIL_URL=f"smtp://127.0.0.1:{closed_port()}")

    quiet = manage("send_reminders", env=down)

    assert quiet.returncode == 0, quiet.stderr
    [line] = lock_lines(quiet.stderr)
    assert " INFO locks.api job=send_reminders " in line and " outcome=succeeded " in line
    assert " due=0 sent=0 failed=0 uncertain=0 skipped=0 " in line
    assert "Traceback" not in quiet.stderr
    with smtp_standin() as server:
        again = manage(
            "send_reminders", "--force", env={**down, "EMAIL_URL": f"smtp://127.0.0.1:{server.port}"}
        )
        four = manage(
            "send_reminders",
            "--force",
            env={**down, "EMAIL_URL": f"smtp://127.0.0.1:{server.port}", "SEND_REMINDERS_CONNECTIONS": "4"},
        )
    assert again.returncode == four.returncode == 0, again.stderr + four.stderr
    assert server.sessions == 0  # not one connection, with one or four of them

    settings.LOCKS_JOBS = {"send_reminders": settings.LOCKS_JOBS["send_reminders"]}
    settings.LOCKS_CHECK_JOBS = False
    settings.LOCKS_TRIGGER_TOKEN = "t" * 40
    settings.EMAIL_BACKEND = "django.core.mail.backends.smtp.EmailBackend"
    settings.EMAIL_HOST, settings.EMAIL_PORT = "127.0.0.1", closed_port()
    health = client.get("/healthz")
    trigger = client.post(
        "/api/jobs/send_reminders/run?force=1",
        REMOTE_ADDR="192.0.2.1",
        HTTP_AUTHORIZATION=f"Bearer {'t' * 40}",
    )

    assert health.status_code == 200, health.content
    assert health.json()["jobs"]["send_reminders"]["status"] == "ok"
    assert trigger.status_code == 200, trigger.content
    assert (trigger.json()["outcome"], trigger.json()["counts"]["sent"]) == ("succeeded", 0)
    assert set(JobRun.objects.values_list("status", flat=True)) == {"succeeded"}


def test_dry_run_counts_and_sends_nothing(env, outbox, soon):
    make_reminder(make_user("alice"), soon, at=-timedelta(minutes=1))

    done = manage("send_reminders", "--dry-run", env=env)

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "dry run, nothing sent: due=1 sent=0 failed=0 uncertain=0 skipped=0"
    assert messages(outbox) == []
    assert not JobRun.objects.exists()
    assert Reminder.objects.get().attempts == 0
    assert Reminder.objects.get().claimed_by == ""


def test_a_bad_argument_exits_2(env):
    done = manage("send_reminders", "--bogus", env=env)
    assert done.returncode == 2
    assert "unrecognized arguments: --bogus" in done.stderr

    done = manage("send_reminders", "--tick", "2026-01-01T00:00:30+00:00", env=env)
    assert done.returncode == 2
    assert (
        "CommandError: --tick: tick 2026-01-01T00:00:30+00:00 is not a slot of the schedule '* * * * *' (UTC)"
        in done.stderr
    )
    assert "Traceback" not in done.stderr
    assert not JobRun.objects.exists()


# --- a run SIGKILLed in the middle (docs/reminders.md, "A crash mid-delivery") --------


def killed_at(point: str, *, env: dict[str, str]) -> str:
    """Run send_reminders --force up to ``point``, SIGKILL it there; the line it printed."""
    proc = spawn(["-m", "tests.contests.reminder_killpoint", point, "send_reminders", "--force"], env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"{point.split(':')[0].upper()} n="), line or proc.stderr.read()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    # The dead run's lease would hold the job until its TTL: the operator's release.
    force_release(job="send_reminders", by="test")
    return line


def expire_claims() -> None:
    """The dead run's claims run out (written into the past, by the database clock)."""
    Reminder.objects.exclude(claimed_until=None).update(claimed_until=Now() - timedelta(seconds=1))


def test_a_crash_between_claim_and_send_delays_the_emails_but_never_loses_them(env, outbox, soon):
    due_reminders(3, contest=soon)
    make_reminder(make_user("later"), soon, at=timedelta(minutes=30))

    killed_at("claimed", env=env)

    assert messages(outbox) == []
    claimed = Reminder.objects.exclude(claimed_until=None)
    assert claimed.count() == 3
    assert set(claimed.values_list("attempts", flat=True)) == {0}  # claimed, never tried
    assert claimed.filter(claimed_until__gt=timezone.now() + timedelta(minutes=9)).count() == 3

    # While the claims last, no run sends them.
    first = manage("send_reminders", "--force", env=env)
    assert first.returncode == 0, first.stderr
    assert "due=0 sent=0 failed=0 uncertain=0 skipped=0" in lock_lines(first.stderr)[0]

    expire_claims()
    second = manage("send_reminders", "--force", env=env)

    assert second.returncode == 0, second.stderr
    assert "due=3 sent=3 failed=0 uncertain=0 skipped=0" in lock_lines(second.stderr)[0]
    assert recipients(outbox) == sorted(f"user{n}@example.com" for n in range(3))  # one each
    assert set(Reminder.objects.filter(delivered_at__isnull=False).values_list("attempts", flat=True)) == {1}


def test_a_crash_between_send_and_record_resends_once_after_the_claim_expires(env, outbox, soon):
    [reminder] = due_reminders(1, contest=soon)

    line = killed_at("sent:1", env=env)

    assert line.strip() == f"SENT n=1 pk={reminder.pk}"
    assert recipients(outbox) == ["user0@example.com"]  # it went out, unrecorded
    reminder.refresh_from_db()
    assert (reminder.attempts, reminder.delivered_at) == (1, None)  # the attempt was counted as it began

    # Within the claim: nothing is sent again.
    early = manage("send_reminders", "--force", env=env)
    assert early.returncode == 0, early.stderr
    assert "due=0 sent=0" in lock_lines(early.stderr)[0]
    assert len(messages(outbox)) == 1

    # After it: the one documented resend, then it is recorded for good.
    expire_claims()
    late = manage("send_reminders", "--force", env=env)
    again = manage("send_reminders", "--force", env=env)

    assert late.returncode == again.returncode == 0
    assert recipients(outbox) == ["user0@example.com"] * 2
    reminder.refresh_from_db()
    assert (reminder.attempts, reminder.delivered_at is not None) == (2, True)
    assert "due=0 sent=0" in lock_lines(again.stderr)[0]


def test_a_reminder_sent_again_after_a_kill_carries_the_same_message_id(db_url, soon):
    """Killed after the 2nd of 3 emails went out (its group unrecorded): after the claims
    expire the next run sends the group again, and each copy of a reminder carries that
    reminder's one Message-ID, so the receiver keeps one message (issue 28, item 3)."""
    reminders = due_reminders(3, contest=soon)
    with smtp_standin() as server:
        env = project_env(
            DATABASE_URL=db_url,
            EMAIL_URL=f"smtp://127.0.0.1:{server.port}",
            SEND_REMINDERS_MESSAGE_ID_DOMAIN="reminders.example.com",
        )

        killed_at("sent:2", env=env)
        first = [(m["To"], m["Message-ID"]) for m in server.messages]
        expire_claims()
        again = manage("send_reminders", "--force", env=env)

    assert again.returncode == 0, again.stderr
    assert "due=3 sent=3" in lock_lines(again.stderr)[0]
    ids = {r.user.email: f"<reminder-{r.pk}@reminders.example.com>" for r in reminders}
    assert len(first) == 2 and all(message_id == ids[to] for to, message_id in first)
    copies = sorted((m["To"], m["Message-ID"]) for m in server.messages)
    assert copies == sorted([*first, *ids.items()])  # the two sent again: the same Message-ID as before
    assert len(set(ids.values())) == 3
    assert {m["Auto-Submitted"] for m in server.messages} == {"auto-generated"}


def test_a_sigkill_mid_batch_resends_at_most_one_group_and_loses_none(db_url, soon):
    """300 due reminders in batches of 100, killed just after the 120th email went out:
    the first 100 were recorded (two groups of RECORD_EVERY), the 20 sent since are not;
    after the dead run's claims expire they go out again: 20 resends (at most
    RECORD_EVERY per crash), no reminder lost. Counted at the SMTP server."""
    pks = many_due_reminders(300, contest=soon)
    with smtp_standin(keep=False) as server:
        env = project_env(
            DATABASE_URL=db_url, EMAIL_URL=f"smtp://127.0.0.1:{server.port}", SEND_REMINDERS_BATCH="100"
        )

        killed_at("sent:120", env=env)

        assert server.total() == 120
        assert Reminder.objects.filter(delivered_at__isnull=False).count() == 100
        in_flight = Reminder.objects.filter(delivered_at__isnull=True, attempts=1)
        assert in_flight.count() == RECORD_EVERY  # the group being sent: its attempts counted
        assert Reminder.objects.exclude(claimed_until=None).count() == 100  # the dead run's second batch

        # While the dead run's claims last, a run sends only the third batch.
        first = manage("send_reminders", "--force", env=env)
        assert first.returncode == 0, first.stderr
        assert "due=100 sent=100 failed=0 uncertain=0" in lock_lines(first.stderr)[0]

        expire_claims()
        second = manage("send_reminders", "--force", env=env)
        assert second.returncode == 0, second.stderr
        assert "due=100 sent=100" in lock_lines(second.stderr)[0]

    assert len(server.received) == 300  # every reminder reached the server, none lost
    resent = sorted(count - 1 for count in server.received.values() if count > 1)
    assert sum(resent) == 20 <= RECORD_EVERY
    assert resent == [1] * 20  # each of them once more, never more
    assert Reminder.objects.filter(pk__in=pks, delivered_at__isnull=False).count() == 300
    assert set(Reminder.objects.values_list("attempts", flat=True)) == {1, 2}


@pytest.mark.parametrize("point", ["started:2", "recorded:1"])
def test_a_sender_frozen_past_its_claim_ttl_sends_nothing_another_run_took_over(db_url, soon, point):
    """Issue 28, item 2: a run stopped (SIGSTOP: a paused VM, a debugger) longer than
    SEND_REMINDERS_CLAIM_TTL (4 s here) while another run takes its reminders over. Frozen
    right after its second group started (attempts counted, claims extended), the renewal
    before its next message finds the claims gone; frozen between two groups, the next
    group's start does. Either way it drops them with one WARNING: each of the 100 reminders
    reaches the SMTP server once, where it used to send the second group again from memory."""
    many_due_reminders(100, contest=soon)
    with smtp_standin(keep=False) as server:
        env = project_env(
            DATABASE_URL=db_url,
            EMAIL_URL=f"smtp://127.0.0.1:{server.port}",
            EMAIL_TIMEOUT="1",
            SEND_REMINDERS_CLAIM_TTL="4",
            SEND_REMINDERS_BATCH="100",
        )
        frozen = spawn(
            ["-m", "tests.contests.reminder_killpoint", point, "send_reminders", "--force"], env=env
        )
        try:
            line = frozen.stdout.readline()
            assert line.startswith(f"{point.split(':')[0].upper()} n="), line or frozen.stderr.read()
            assert server.total() == RECORD_EVERY  # its first group, recorded; the second one not sent
            # Past the claim TTL, by the database clock: every claim of the frozen run expired.
            deadline = time.monotonic() + 30
            unsent = Reminder.objects.filter(delivered_at__isnull=True)
            while unsent.filter(claimed_until__gte=Now()).exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            assert unsent.count() == 100 - RECORD_EVERY
            assert not unsent.filter(claimed_until__gte=Now()).exists()
            force_release(job="send_reminders", by="test")  # the frozen run's lease (its TTL is 120 s)
            takeover = manage("send_reminders", "--force", env=env)
            assert takeover.returncode == 0, takeover.stderr
            assert "due=50 sent=50 failed=0 uncertain=0 skipped=0" in lock_lines(takeover.stderr)[0]
        finally:
            frozen.send_signal(signal.SIGCONT)
        _, stderr = frozen.communicate(timeout=60)

    assert len(server.received) == 100 and set(server.received.values()) == {1}, stderr
    assert Reminder.objects.filter(delivered_at__isnull=False).count() == 100
    warnings = [line for line in stderr.splitlines() if " WARNING contests.reminders " in line]
    assert len(warnings) == 1, stderr
    # Its lease was taken over too: the run ends lost_lock, with what it did send.
    [ended] = lock_lines(stderr)
    assert frozen.returncode == 1 and " outcome=lost_lock " in ended and " due=100 sent=50 " in ended
    assert (
        "50 of its reminders are no longer its own (its claim expired while this run was stopped"
        in warnings[0]
    )
    assert "Traceback" not in stderr


@pytest.mark.parametrize("connections", [1, 2])
def test_a_sigterm_mid_batch_records_what_was_sent_and_releases_the_rest(db_url, soon, connections):
    """A stopped pod: SIGTERM arrives while the 30th message waits for its 250. With two
    connections (threads) each finishes the message it is on. With one, the main thread
    may be interrupted mid-send (if the kernel hands the signal to it rather than to the
    heartbeat thread): then that message, sent and unanswered, is uncertain. Either way
    every message the server got is recorded, the rest are released with no attempt used,
    the run is recorded as interrupted, and the next run sends each remaining one once."""
    many_due_reminders(200, contest=soon)
    with smtp_standin(keep=False) as server:
        reached, go = threading.Event(), threading.Event()

        def pause_at_30(recipient: str) -> None:
            if server.total() == 30:
                reached.set()
                go.wait(30)

        server.on_message = pause_at_30
        env = project_env(
            DATABASE_URL=db_url,
            EMAIL_URL=f"smtp://127.0.0.1:{server.port}",
            SEND_REMINDERS_BATCH="100",
            SEND_REMINDERS_CONNECTIONS=str(connections),
        )
        proc = spawn(["manage.py", "send_reminders", "--force"], env=env)
        assert reached.wait(60), proc.stderr.read() if proc.poll() is not None else "no 30th message"
        proc.send_signal(signal.SIGTERM)
        time.sleep(0.5)  # the signal handled while the 30th answer is still held back
        go.set()
        _, stderr = proc.communicate(timeout=60)

        assert proc.returncode == 128 + signal.SIGTERM, stderr
        [line] = lock_lines(stderr)
        assert " ERROR locks.api job=send_reminders " in line
        assert "outcome=failed" in line and "error=interrupted: SystemExit: 143" in line
        delivered = Reminder.objects.filter(delivered_at__isnull=False)
        uncertain = Reminder.objects.filter(uncertain_at__isnull=False)
        # Every message that reached the server is recorded: delivered, or uncertain.
        assert delivered.count() + uncertain.count() == server.total()
        assert uncertain.count() <= (1 if connections == 1 else 0)
        rest = Reminder.objects.filter(delivered_at__isnull=True, uncertain_at__isnull=True)
        assert rest.count() == 200 - delivered.count() - uncertain.count() > 0
        assert set(rest.values_list("attempts", "claimed_until")) == {(0, None)}

        done = manage("send_reminders", "--force", env=env)
        assert done.returncode == 0, done.stderr

    assert len(server.received) == 200
    assert set(server.received.values()) == {1}  # each once: the uncertain one was not sent again


# --- every EMAIL_URL scheme, with the stage the unknown outcome needs --------------------


@pytest.mark.parametrize("scheme", ["smtp", "smtp+tls", "smtp+ssl"])
def test_every_email_url_scheme_delivers_and_tells_a_lost_answer_from_a_refusal(
    db_url, soon, tmp_path, scheme
):
    """Over plain SMTP, STARTTLS and implicit TLS (a real certificate the client is told
    to trust): one reminder delivered, one refused at RCPT (pending, tried again), and
    one whose answer never comes (uncertain)."""
    context, cert = self_signed(tmp_path)
    tls = {"smtp": {}, "smtp+tls": {"starttls": context}, "smtp+ssl": {"implicit_tls": context}}[scheme]
    delivered = make_reminder(make_user("first"), soon, at=-timedelta(minutes=3))
    refused = make_reminder(make_user("ghost"), soon, at=-timedelta(minutes=2))
    lost = make_reminder(make_user("lost"), soon, at=-timedelta(minutes=1))
    with smtp_standin(**tls) as server:
        server.refused.add("ghost@example.com")
        server.late.add("lost@example.com")
        env = project_env(
            DATABASE_URL=db_url,
            EMAIL_URL=f"{scheme}://127.0.0.1:{server.port}",
            EMAIL_TIMEOUT="1",
            SSL_CERT_FILE=str(cert),
        )

        done = manage("send_reminders", env=env)

    assert done.returncode == 1, done.stderr
    [line] = lock_lines(done.stderr)
    assert " ERROR locks.api job=send_reminders " in line and "outcome=failed" in line
    assert "error=connection 1: the mail server connection failed: SMTPServerDisconnected" in line
    assert "Traceback" not in done.stderr
    assert server.received == {"first@example.com": 1, "lost@example.com": 1}
    assert server.sessions == 1
    values = {
        r.pk: (r.attempts, r.delivered_at is not None, r.uncertain_at is not None)
        for r in Reminder.objects.all()
    }
    assert values == {
        delivered.pk: (1, True, False),
        refused.pk: (1, False, False),
        lost.pk: (1, False, True),
    }
