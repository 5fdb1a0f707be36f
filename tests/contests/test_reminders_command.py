"""`manage.py send_reminders` as real processes: exactly one email per due reminder,
even with concurrent runs and a run SIGKILLed between claim, send and record."""

from __future__ import annotations

import email
import json
import signal
import subprocess
import sys
import textwrap
import time
from datetime import timedelta
from email.message import Message
from pathlib import Path

import pytest
from django.db.models.functions import Now
from django.utils import timezone

from contests.models import Reminder
from locks.models import JobRun
from locks.operations import force_release
from tests.conftest import ROOT, manage, project_env, spawn
from tests.contests.reminder_data import due_reminders, make_contest, make_reminder, make_user
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
    assert (nobody.delivered_at, nobody.last_error) == (None, "not sent: user nomail has no email address")
    assert Reminder.objects.filter(delivered_at__isnull=False).count() == 24  # nothing else was sent


WORKER = textwrap.dedent(
    """
    import json, sys
    import django
    django.setup()
    from contests import reminders

    claim, waited = reminders.claim_reminder, []

    def claim_reminder(**kwargs):
        if not waited:  # every worker has read the same due reminders: now all claim
            print("READ", flush=True)
            sys.stdin.readline()
            waited.append(True)
        return claim(**kwargs)

    reminders.claim_reminder = claim_reminder
    print(json.dumps(reminders.deliver_due_reminders().as_dict()), flush=True)
    """
)


def test_the_claims_alone_keep_overlapping_runs_to_one_email_each(env, outbox, soon):
    """No lease here: four services that all read the same 40 due reminders before
    any of them claims one; only the conditional update decides who sends each."""
    due_reminders(40, contest=soon)
    procs = [
        subprocess.Popen(
            [sys.executable, "-c", WORKER],
            cwd=ROOT,
            env={**env, "DJANGO_SETTINGS_MODULE": "config.settings"},
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    for proc in procs:
        assert proc.stdout.readline() == "READ\n"
    for proc in procs:
        proc.stdin.write("go\n")
        proc.stdin.flush()
    outputs = [proc.communicate(timeout=120) for proc in procs]

    assert [proc.returncode for proc in procs] == [0] * 4, outputs
    stats = [json.loads(out) for out, _ in outputs]
    assert [s["due"] for s in stats] == [40] * 4
    assert sum(s["sent"] for s in stats) == 40
    assert recipients(outbox) == sorted(f"user{n}@example.com" for n in range(40))
    assert set(Reminder.objects.values_list("attempts", flat=True)) == {1}


def test_one_log_line_with_the_counts_and_the_counts_on_the_run(env, soon):
    make_reminder(make_user("alice"), soon, at=-timedelta(minutes=1))
    make_reminder(make_user("bob", email=""), soon, at=-timedelta(minutes=1))

    done = manage("send_reminders", env=env)

    assert done.returncode == 0, done.stderr
    [line] = lock_lines(done.stderr)
    assert " INFO locks.api job=send_reminders tick=" in line
    assert " outcome=succeeded " in line
    assert " due=2 sent=1 failed=0 skipped=1 duration=" in line
    run = JobRun.objects.get(job_name="send_reminders")
    assert run.stats == {"due": 2, "sent": 1, "failed": 0, "skipped": 1}


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


def test_dry_run_counts_and_sends_nothing(env, outbox, soon):
    make_reminder(make_user("alice"), soon, at=-timedelta(minutes=1))

    done = manage("send_reminders", "--dry-run", env=env)

    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "dry run, nothing sent: due=1 sent=0 failed=0 skipped=0"
    assert messages(outbox) == []
    assert not JobRun.objects.exists()
    assert Reminder.objects.get().attempts == 0


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


def killed_at(point: str, *, env: dict[str, str]) -> int:
    """Run send_reminders --force up to ``point``, SIGKILL it there; the reminder's pk."""
    proc = spawn(["-m", "tests.contests.reminder_killpoint", point, "send_reminders", "--force"], env=env)
    try:
        line = proc.stdout.readline()
        assert line.startswith(f"{point.upper()} pk="), line or proc.stderr.read()
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    assert proc.returncode == -signal.SIGKILL
    # The dead run's lease would hold the job until its TTL: the operator's release.
    force_release(job="send_reminders", by="test")
    return int(line.split("=")[1])


def expire_claim(pk: int) -> None:
    """The claim's time passes (written into the past, by the database clock)."""
    Reminder.objects.filter(pk=pk).update(claimed_until=Now() - timedelta(seconds=1))


def test_a_crash_between_claim_and_send_delays_the_email_but_never_loses_it(env, outbox, soon):
    due_reminders(3, contest=soon)

    pk = killed_at("claimed", env=env)

    assert messages(outbox) == []
    claimed = Reminder.objects.get(pk=pk)
    assert (claimed.attempts, claimed.delivered_at) == (1, None)
    assert claimed.claimed_until > timezone.now() + timedelta(minutes=9)

    # While the claim lasts, a run sends the others only.
    first = manage("send_reminders", "--force", env=env)
    assert first.returncode == 0, first.stderr
    assert "due=2 sent=2 failed=0 skipped=0" in lock_lines(first.stderr)[0]
    assert claimed.user.email not in recipients(outbox)

    expire_claim(pk)
    second = manage("send_reminders", "--force", env=env)

    assert second.returncode == 0, second.stderr
    assert "due=1 sent=1 failed=0 skipped=0" in lock_lines(second.stderr)[0]
    assert recipients(outbox) == sorted(f"user{n}@example.com" for n in range(3))  # one each
    claimed.refresh_from_db()
    assert (claimed.attempts, claimed.delivered_at is not None, claimed.claimed_until) == (2, True, None)


def test_a_crash_between_send_and_record_resends_once_after_the_claim_expires(env, outbox, soon):
    [reminder] = due_reminders(1, contest=soon)

    pk = killed_at("sent", env=env)

    assert pk == reminder.pk
    assert recipients(outbox) == ["user0@example.com"]  # it went out, unrecorded
    reminder.refresh_from_db()
    assert (reminder.attempts, reminder.delivered_at) == (1, None)

    # Within the claim: nothing is sent again.
    early = manage("send_reminders", "--force", env=env)
    assert early.returncode == 0, early.stderr
    assert "due=0 sent=0" in lock_lines(early.stderr)[0]
    assert len(messages(outbox)) == 1

    # After it: the one documented resend, then it is recorded for good.
    expire_claim(pk)
    late = manage("send_reminders", "--force", env=env)
    again = manage("send_reminders", "--force", env=env)

    assert late.returncode == again.returncode == 0
    assert recipients(outbox) == ["user0@example.com"] * 2
    reminder.refresh_from_db()
    assert (reminder.attempts, reminder.delivered_at is not None) == (2, True)
    assert "due=0 sent=0" in lock_lines(again.stderr)[0]
