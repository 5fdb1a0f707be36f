"""What comes from outside reaches logs, rows and answers safely (issue 21, items 2 to 4):
credentials in CODEFORCES_API_URL are never shown, upstream text is quoted and cut, and a
hostile answer under the size cap cannot make the sync's memory explode."""

from __future__ import annotations

import base64
import json
import logging
import re
import secrets
import sys

import pytest
from django.urls import reverse

from contests.codeforces import EXAMPLES, MAX_VALUES, CodeforcesError, parse_contest_list
from contests.text import LIMIT, safe_text, without_userinfo
from locks.models import JobRun, SyncLock
from tests.conftest import ROOT, manage, project_env, spawn

TICK = "2026-11-30T14:00:00+00:00"
TOKEN = secrets.token_urlsafe(32)
SECRET = "S3cret"
FORGED = "2026-11-30 14:00:01,000 INFO locks.api job=sync_contests outcome=succeeded FORGED-LOG-LINE"
pytestmark = pytest.mark.slow


def _entry(**fields) -> dict:
    entry = {"id": 1, "name": "Round 1", "type": "CF", "phase": "BEFORE", "frozen": False}
    entry.update(durationSeconds=7200, startTimeSeconds=1_700_000_000, **fields)
    return entry


# --- the helpers ------------------------------------------------------------------


@pytest.mark.parametrize(
    ("url", "shown"),
    [
        ("http://mirror:S3cret@127.0.0.1:8765/api", "http://127.0.0.1:8765/api"),
        ("http://mirror:S3c/ret@127.0.0.1:8765/api", "http://127.0.0.1:8765/api"),  # '/' unescaped
        ("https://mirror@cf.example/api?key=a", "https://cf.example/api?key=a"),
        ("mirror:S3cret@cf.example/api", "cf.example/api"),  # no scheme
        ("https://codeforces.com/api", "https://codeforces.com/api"),
    ],
)
def test_without_userinfo(url, shown):
    assert without_userinfo(url) == shown


def test_safe_text_escapes_control_characters_and_cuts():
    assert safe_text("a\nb\x1b[31m\u202ec\td") == "a\\nb\\x1b[31m\\u202ec\\td"
    assert safe_text("x" * (LIMIT + 7)) == "x" * LIMIT + "… (7 more)"
    assert safe_text("it's\n", quote=True) == '"it\'s\\n"'
    assert len(safe_text(list(range(10**6)))) < LIMIT + 10  # a bounded repr of a non-string


# --- item 2: credentials in CODEFORCES_API_URL ---------------------------------------


@pytest.fixture
def mirror(standin):
    """The stand-in reached through a URL that carries credentials, answering HTTP 500."""
    standin.status, standin.body = 500, b"down"
    standin.secret_url = standin.url.replace("http://", f"http://mirror:{SECRET}@")
    return standin


def _assert_secret_absent(*texts: str) -> None:
    for text in texts:
        assert SECRET not in text and "mirror:" not in text, text


def test_credentials_in_the_api_url_reach_no_log_row_page_or_answer(
    mirror, db_url, admin_client, settings, caplog
):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]
    env = project_env(DATABASE_URL=db_url, CODEFORCES_API_URL=mirror.secret_url, CODEFORCES_MAX_ATTEMPTS="2")

    proc = manage("sync_contests", "--tick", TICK, env=env)

    assert proc.returncode == 1, proc.stderr
    # The credentials were used (basic auth), and the messages name the URL without them.
    expected = "Basic " + base64.b64encode(f"mirror:{SECRET}".encode()).decode()
    assert mirror.headers[0]["Authorization"] == expected
    assert f"Codeforces API at {mirror.url}/contest.list answered HTTP 500" in proc.stdout
    assert "retrying in" in proc.stderr  # the WARNING line of the first attempt
    run, lock = JobRun.objects.get(), SyncLock.objects.get(job_name="sync_contests")
    assert mirror.url in run.error and mirror.url in lock.last_error
    _assert_secret_absent(proc.stdout, proc.stderr, run.error, lock.last_error)

    # The admin's list and detail pages, /healthz details, the trigger's answer and log line.
    pages = [
        admin_client.get(reverse("admin:locks_jobrun_changelist")),
        admin_client.get(reverse("admin:locks_jobrun_change", args=[run.pk])),
        admin_client.get(reverse("admin:locks_synclock_change", args=[lock.pk])),
    ]
    assert all(page.status_code == 200 for page in pages)
    assert all(mirror.url in page.content.decode() for page in pages)
    settings.LOCKS_HEALTHZ_TOKEN, settings.LOCKS_TRIGGER_TOKEN = TOKEN, TOKEN[::-1]
    settings.CODEFORCES_API_URL = mirror.secret_url
    health = admin_client.get("/healthz", HTTP_AUTHORIZATION=f"Bearer {TOKEN}").json()
    assert mirror.url in health["jobs"]["sync_contests"]["lock"]["last_error"]
    with caplog.at_level(logging.INFO):
        answer = admin_client.post(
            "/api/jobs/sync_contests/run?force=1", HTTP_AUTHORIZATION=f"Bearer {TOKEN[::-1]}"
        )
    assert answer.status_code == 502 and mirror.url in answer.json()["error"]
    _assert_secret_absent(
        *(page.content.decode() for page in pages), json.dumps(health), answer.content.decode(), caplog.text
    )


def test_credentials_never_shown_when_nobody_listens(db_url):
    url = f"http://mirror:{SECRET}@127.0.0.1:9/api"
    env = project_env(DATABASE_URL=db_url, CODEFORCES_API_URL=url, CODEFORCES_MAX_ATTEMPTS="1")

    proc = manage("sync_contests", "--tick", TICK, env=env)

    assert proc.returncode == 1, proc.stderr
    assert "error=cannot connect to the Codeforces API at http://127.0.0.1:9/api/contest.list" in proc.stdout
    _assert_secret_absent(proc.stdout, proc.stderr, JobRun.objects.get().error)


def test_an_unescaped_slash_in_the_password_stops_start_up_without_showing_it(db_url, standin):
    """requests would answer "Failed to parse: 'mirror:S3c' is not a valid host or port"."""
    env = project_env(DATABASE_URL=db_url, CODEFORCES_API_URL=standin.url.replace("//", "//mirror:S3c/ret@"))

    proc = manage("sync_contests", "--tick", TICK, env=env)

    assert proc.returncode == 1
    [line] = proc.stderr.splitlines()
    assert line.startswith("ImproperlyConfigured: CODEFORCES_API_URL is not a valid URL: ")
    assert "S3c" not in line and "ret" not in line and "mirror" not in line
    assert standin.calls == 0 and not JobRun.objects.exists()


def test_a_redirect_target_is_shown_without_its_credentials(standin):
    standin.status, standin.body = 302, b""
    standin.response_headers = {"Location": f"http://mirror:{SECRET}@elsewhere.example/api"}

    from contests.codeforces import CodeforcesClient

    with pytest.raises(CodeforcesError, match=r"redirecting to 'http://elsewhere.example/api'") as excinfo:
        CodeforcesClient().contest_list()
    assert SECRET not in str(excinfo.value)


# --- item 3: upstream text quoted and cut ----------------------------------------------


def test_a_huge_comment_with_newlines_forges_no_log_line_and_is_cut(db_url, standin, settings, client):
    comment = f"broken\n{FORGED}\n" + "x" * 15_000_000
    standin.status = 400
    standin.set_payload({"status": "FAILED", "comment": comment})
    env = project_env(DATABASE_URL=db_url, CODEFORCES_API_URL=standin.url, CODEFORCES_MAX_ATTEMPTS="1")

    proc = manage("sync_contests", "--tick", TICK, env=env, timeout=120)

    assert proc.returncode == 1, proc.stderr[-2000:]
    assert not [
        line for line in proc.stderr.splitlines() if "FORGED-LOG-LINE" in line and "ERROR" not in line
    ]
    [error_line] = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert "answered status 'FAILED': broken\\n2026-11-30 14:00:01,000 INFO" in error_line
    assert f"… ({len(comment) - LIMIT:,} more)".replace(",", "") in error_line
    assert len(error_line) < 2 * LIMIT + 400 and len(proc.stdout) < 2 * LIMIT + 400
    run = JobRun.objects.get()
    assert "\n" not in run.error and len(run.error) < 2 * LIMIT
    # The trigger's JSON carries the same cut text.
    settings.LOCKS_TRIGGER_TOKEN, settings.CODEFORCES_MAX_ATTEMPTS = TOKEN, 1
    answer = client.post("/api/jobs/sync_contests/run?force=1", HTTP_AUTHORIZATION=f"Bearer {TOKEN}")
    assert answer.status_code == 502
    assert len(answer.json()["error"]) < 2 * LIMIT and "\n" not in answer.json()["error"]


def test_outside_values_in_entry_messages_are_quoted_and_cut(caplog):
    entries = [
        _entry(id=f"7\n{FORGED}"),
        _entry(id=2, name=["x"] * 100_000),
        _entry(id=3, frozen="\x1b[2J" + "y" * 10_000),
        *(_entry(id=i) for i in range(10, 20)),
    ]
    with caplog.at_level(logging.WARNING, logger="contests.codeforces"):
        result = parse_contest_list({"status": "OK", "result": entries})

    assert result.invalid == 3
    [warning] = [r.getMessage() for r in caplog.records]
    assert "\n" not in warning and "\x1b" not in warning
    assert f"id '7\\n{FORGED[:40]}" in warning
    assert "name ['x', 'x', 'x', 'x', 'x', 'x', ...] is not a non-empty string" in warning
    assert "frozen '\\x1b[2J" in warning and "more) is not a boolean" in warning
    assert len(warning) < 1000


def test_one_warning_per_kind_of_unknown_value_with_a_count_and_examples(caplog):
    entries = [_entry(id=i, phase=f"PHASE{i:04}\n", type=f"T{i % 2}") for i in range(1, 3001)]
    with caplog.at_level(logging.WARNING, logger="contests.codeforces"):
        result = parse_contest_list({"status": "OK", "result": entries})

    assert len(result.records) == 3000
    assert [r.getMessage() for r in caplog.records] == [
        "Codeforces: unknown contest phase 'PHASE0001\\n', 'PHASE0002\\n', 'PHASE0003\\n' and 2997 more "
        "(3000 contests) kept as is",
        "Codeforces: unknown contest type 'T0', 'T1' (3000 contests) kept as is",
    ]


# --- item 4: bounded memory under the size cap --------------------------------------------


def test_a_few_invalid_entries_are_described_all_are_counted(caplog):
    entries = [0] * 9 + [_entry(id=i) for i in range(1, 9)]
    with (
        caplog.at_level(logging.WARNING, logger="contests.codeforces"),
        pytest.raises(CodeforcesError) as excinfo,
    ):
        parse_contest_list({"status": "OK", "result": entries})

    first = "; ".join(f"entry {i}: not an object but int" for i in range(EXAMPLES))
    assert str(excinfo.value) == (
        f"Codeforces API answer is mostly invalid: 9 of 17 entries rejected (first: {first}); nothing was written"
    )
    assert caplog.records[0].getMessage() == f"Codeforces: skipped 9 invalid entries; first: {first}"


CAP = 20 * 1024 * 1024  # CODEFORCES_MAX_BYTES' default
HEAD, TAIL = b'{"status":"OK","result":[', b"]}"
# manage.py ARGS in this process, then its peak RSS (VmHWM, KiB) on stderr.
PEAK_RSS = """
import runpy, sys
sys.argv = ["manage.py", *sys.argv[1:]]
try:
    runpy.run_path("manage.py", run_name="__main__")
finally:
    peak = [line for line in open("/proc/self/status") if line.startswith("VmHWM:")][0]
    print("peak_kib=" + peak.split()[1], file=sys.stderr)
"""


def _fill(item: bytes, size: int = CAP) -> bytes:
    """An answer of ``item`` repeated to just under ``size`` bytes."""
    count = (size - len(HEAD) - len(TAIL) + 1) // (len(item) + 1)
    return HEAD + b",".join([item] * count) + TAIL


@pytest.mark.parametrize(
    ("item", "outcome"),
    [
        # 10 million zeros: the sync took 1.2 GB building one message per entry. Refused undecoded.
        (b"0", "holding up to 10,485,749 JSON values, more than the 200,000 a contest list may have"),
        # 20 MB of invalid entries (3 values each) within the value cap: decoded, counted, refused.
        (json.dumps({"id": -1, "name": "n" * 300}).encode(), "entries rejected (first: entry 0: id -1 is"),
    ],
)
def test_peak_memory_of_a_sync_of_a_hostile_answer_under_the_cap(db_url, standin, item, outcome):
    """Issue 21, item 4: peak RSS <= 3 * CODEFORCES_MAX_BYTES + 100 MB. Measured as the
    child's own high-water mark (VmHWM): getrusage(RUSAGE_CHILDREN) would also count the
    pages the child shared with this (large) pytest process until it exec'd."""
    body = _fill(item)
    assert CAP - len(item) <= len(body) <= CAP
    standin.set_payload(body)
    env = project_env(DATABASE_URL=db_url, CODEFORCES_API_URL=standin.url, CODEFORCES_MAX_ATTEMPTS="1")
    proc = spawn(["-c", PEAK_RSS, "sync_contests", "--tick", TICK], env=env)
    out, err = proc.communicate(timeout=240)

    assert proc.returncode == 1, err[-2000:]
    assert outcome in out, out
    peak = int(re.search(r"peak_kib=(\d+)", err)[1]) * 1024
    assert peak <= 3 * CAP + 100 * 1024 * 1024, f"peak RSS {peak / 2**20:.0f} MiB"
    assert not SyncLock.objects.filter(job_name="sync_contests", last_status="succeeded").exists()
    print(f"peak RSS {peak / 2**20:.0f} MiB for {len(body):,} bytes", file=sys.stderr)


def test_the_real_list_is_far_below_the_value_cap():
    body = (ROOT / "tests" / "fixtures" / "codeforces-contest-list-2023-07.json").read_bytes()
    assert body.count(b",") + body.count(b"[") + body.count(b"{") < MAX_VALUES / 10
