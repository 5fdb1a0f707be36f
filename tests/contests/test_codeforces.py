"""The Codeforces client against a real local HTTP server."""

import json
import logging
import time
from datetime import UTC, datetime, timedelta

import pytest

from contests.codeforces import (
    MAX_CONTEST_ID,
    MAX_DURATION,
    USER_AGENT,
    CodeforcesClient,
    CodeforcesError,
    parse_contest_list,
)

CALL_LIMIT = json.dumps({"status": "FAILED", "comment": "Call limit exceeded"}).encode()


def test_the_real_list_parses_completely(standin):
    result = CodeforcesClient().contest_list()

    assert (len(result.records), result.invalid, result.attempts, standin.calls) == (1758, 0, 1, 1)
    first = result.records[0]
    assert first.contest_id == 1849
    assert first.name == "Educational Codeforces Round 152 (Rated for Div. 2)"
    assert (first.type, first.phase, first.frozen) == ("ICPC", "BEFORE", False)
    assert first.start_time == datetime.fromtimestamp(1690468500, tz=UTC)
    assert first.duration == timedelta(hours=2)


def test_the_request_asks_without_gym_and_names_the_project(standin):
    CodeforcesClient().contest_list()

    assert standin.requests == ["/api/contest.list?gym=false"]
    assert standin.headers[0]["User-Agent"] == USER_AGENT
    assert USER_AGENT.startswith("cf-contest-sync/")


def test_a_5xx_then_success_is_retried(standin):
    standin.queue = [(503, b"busy")]

    result = CodeforcesClient().contest_list()

    assert (len(result.records), result.attempts, standin.calls) == (1758, 2, 2)


def test_a_429_then_success_is_retried(standin):
    standin.queue = [(429, b"slow down")]

    assert len(CodeforcesClient().contest_list().records) == 1758
    assert standin.calls == 2


def test_http_500_on_every_attempt_gives_up_after_three(standin):
    standin.status, standin.body = 500, b"oops"

    with pytest.raises(CodeforcesError, match=r"kept failing after 3 attempts|answered HTTP 500"):
        CodeforcesClient().contest_list()
    assert standin.calls == 3


def test_call_limit_then_success_is_retried(standin):
    standin.queue = [(400, CALL_LIMIT)]

    result = CodeforcesClient().contest_list()

    assert (len(result.records), result.attempts, standin.calls) == (1758, 2, 2)


def test_call_limit_on_every_attempt_gives_up_after_three(standin):
    standin.status, standin.body = 400, CALL_LIMIT

    with pytest.raises(CodeforcesError, match="answered status 'FAILED': Call limit exceeded"):
        CodeforcesClient().contest_list()
    assert standin.calls == 3


def test_a_failed_status_is_not_retried(standin):
    standin.status, standin.body = 400, b'{"status":"FAILED","comment":"gym: must be boolean"}'

    with pytest.raises(CodeforcesError, match="answered status 'FAILED': gym: must be boolean"):
        CodeforcesClient().contest_list()
    assert standin.calls == 1


def test_truncated_json(standin):
    standin.body = standin.body[: len(standin.body) // 2]

    with pytest.raises(CodeforcesError, match="body that is not JSON"):
        CodeforcesClient().contest_list()


def test_a_response_over_the_cap_is_refused(standin, settings):
    settings.CODEFORCES_MAX_BYTES = 100_000

    with pytest.raises(CodeforcesError, match=r"over the 100,000-byte cap \(CODEFORCES_MAX_BYTES\)"):
        CodeforcesClient().contest_list()


def test_a_server_that_never_answers_times_out(standin):
    standin.delay = 3

    with pytest.raises(CodeforcesError, match=r"did not answer within 0.5 s \(2 attempts\)"):
        CodeforcesClient(timeout=(0.5, 0.5), max_attempts=2).contest_list()
    assert standin.calls == 2


def test_nobody_listening():
    with pytest.raises(CodeforcesError, match=r"cannot connect .*: Connection refused \(3 attempts\)$"):
        CodeforcesClient(base_url="http://127.0.0.1:9/api", backoff=0).contest_list()


def test_a_body_nested_too_deeply_to_parse_is_a_clear_error(standin):
    standin.set_payload(b"[" * 200_000)

    with pytest.raises(
        CodeforcesError, match=r"HTTP 200 with JSON nested too deeply to parse \(200000 bytes\)$"
    ):
        CodeforcesClient().contest_list()


# --- the total deadline (CODEFORCES_TOTAL_TIMEOUT) ---------------------------

DEADLINE = r"did not answer within 1.5 s \(total deadline CODEFORCES_TOTAL_TIMEOUT\)$"


def test_a_trickled_answer_ends_at_the_total_deadline(standin):
    # One byte every 0.2 s: the 2 s read timeout never fires, the deadline must.
    standin.trickle, standin.trickle_for = 0.2, 30

    started = time.monotonic()
    with pytest.raises(CodeforcesError, match=DEADLINE):
        CodeforcesClient(total_timeout=1.5).contest_list()

    assert time.monotonic() - started < 10  # ended by the deadline, not by the 30 s server bound
    assert standin.calls == 1  # no retry after the deadline
    assert standin.trickled >= 2  # the body was arriving, just too slowly


def test_the_read_timeout_is_cut_to_the_time_left(standin):
    standin.delay = 10  # silent for longer than the deadline, shorter than the read timeout

    started = time.monotonic()
    with pytest.raises(CodeforcesError, match=DEADLINE):
        CodeforcesClient(timeout=(5, 30), total_timeout=1.5).contest_list()

    assert time.monotonic() - started < 8
    assert standin.calls == 1


def test_a_retry_after_longer_than_the_deadline_is_cut_short(standin):
    standin.queue = [(503, b"busy")]
    standin.response_headers = {"Retry-After": "3600"}

    started = time.monotonic()
    with pytest.raises(CodeforcesError, match=DEADLINE):
        CodeforcesClient(total_timeout=1.5).contest_list()

    assert time.monotonic() - started < 8
    assert standin.calls == 1  # the wait ran into the deadline; no second request


def test_retries_stop_at_the_deadline(standin):
    standin.delay = 0.7  # each attempt times out on its 0.5 s read timeout

    with pytest.raises(CodeforcesError, match=DEADLINE):
        CodeforcesClient(timeout=(0.5, 0.5), max_attempts=10, backoff=0, total_timeout=1.5).contest_list()

    assert 2 <= standin.calls <= 4  # 10 attempts allowed; the deadline ended them


def test_the_total_deadline_comes_from_settings(settings, standin):
    settings.CODEFORCES_TOTAL_TIMEOUT = 1.5
    standin.trickle = 0.2

    with pytest.raises(CodeforcesError, match=DEADLINE):
        CodeforcesClient().contest_list()


# --- validation -------------------------------------------------------------


def _entry(**fields) -> dict:
    entry = {
        "id": 1,
        "name": "Round 1",
        "type": "CF",
        "phase": "FINISHED",
        "frozen": False,
        "durationSeconds": 7200,
        "startTimeSeconds": 1_600_000_000,
    }
    entry.update(fields)
    return {k: v for k, v in entry.items() if v is not ...}


@pytest.mark.parametrize(
    ("fields", "problem"),
    [
        ({"id": 0}, "id 0 is not a positive integer"),
        ({"id": -3}, "id -3 is not a positive integer"),
        ({"id": "12"}, "id '12' is not a positive integer"),
        ({"id": True}, "id True is not a positive integer"),
        ({"id": ...}, "id None is not a positive integer"),
        ({"name": ""}, "name '' is not a non-empty string"),
        ({"name": "   "}, "name '   ' is not a non-empty string"),
        ({"name": None}, "name None is not a non-empty string"),
        ({"phase": 3}, "phase 3 is not a string"),
        ({"type": ...}, "type None is not a string"),
        ({"durationSeconds": -1}, "durationSeconds -1 is not a non-negative integer"),
        ({"durationSeconds": 1.5}, "durationSeconds 1.5 is not a non-negative integer"),
        ({"startTimeSeconds": "soon"}, "startTimeSeconds 'soon' is not an integer"),
        ({"frozen": "no"}, "frozen 'no' is not a boolean"),
        # Well-formed, but no database could store them (issue 12, item 6).
        ({"id": 2**31}, "id 2147483648 is over the largest storable id 2147483647"),
        ({"id": 2**63}, "id 9223372036854775808 is over the largest storable id"),
        ({"durationSeconds": 10**20}, "durationSeconds 100000000000000000000 is over 36525 days"),
        (
            {"startTimeSeconds": 10**20},
            "startTimeSeconds 100000000000000000000 is out of range (1970 to 3000)",
        ),
        ({"startTimeSeconds": 253402300800}, "startTimeSeconds 253402300800 is out of range"),  # year 10000
        ({"startTimeSeconds": -1}, "startTimeSeconds -1 is out of range"),
        ({"name": "Round\x001"}, "contest 1: name contains a NUL character"),
        ({"type": "C\x00F"}, "contest 1: type contains a NUL character"),
        ({"phase": "BEFORE\x00"}, "contest 1: phase contains a NUL character"),
        (
            {"name": "Round \ud800"},
            "contest 1: name is not valid Unicode (surrogates not allowed at position 6)",
        ),
        ({"type": "\udfffCF"}, "contest 1: type is not valid Unicode (surrogates not allowed at position 0)"),
    ],
)
def test_a_bad_entry_is_skipped_counted_and_logged(caplog, fields, problem):
    good = [_entry(id=i, name=f"Round {i}") for i in range(2, 5)]

    with caplog.at_level(logging.WARNING, logger="contests.codeforces"):
        result = parse_contest_list({"status": "OK", "result": [_entry(**fields), *good]})

    assert [r.contest_id for r in result.records] == [2, 3, 4]
    assert result.invalid == 1
    [warning] = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warning.startswith("Codeforces: skipped 1 invalid entries; first: entry 0: ")
    assert problem in warning


def test_the_largest_storable_values_are_accepted():
    entry = _entry(
        id=MAX_CONTEST_ID,
        durationSeconds=int(MAX_DURATION.total_seconds()),
        startTimeSeconds=int(datetime(2999, 12, 31, 23, 59, tzinfo=UTC).timestamp()),
        name="Раунд 🏁 #1",  # beyond ASCII and beyond the BMP are fine
    )

    [record] = parse_contest_list({"status": "OK", "result": [entry]}).records

    assert (record.contest_id, record.duration, record.start_time.year) == (2**31 - 1, MAX_DURATION, 2999)
    assert record.name == "Раунд 🏁 #1"


def test_a_name_over_the_column_length_is_cut_not_skipped():
    result = parse_contest_list({"status": "OK", "result": [_entry(name="x" * 600, type="T" * 30)]})

    assert result.invalid == 0
    assert (result.records[0].name, result.records[0].type) == ("x" * 500, "T" * 20)


def test_a_missing_start_time_is_allowed():
    [record] = parse_contest_list({"status": "OK", "result": [_entry(startTimeSeconds=...)]}).records
    assert record.start_time is None


def test_duplicate_ids_count_as_invalid():
    result = parse_contest_list({"status": "OK", "result": [_entry(), _entry(name="again"), _entry(id=2)]})
    assert [r.name for r in result.records] == ["Round 1", "Round 1"]
    assert result.invalid == 1


def test_unknown_phase_and_type_are_kept_and_logged_once(caplog):
    entries = [_entry(id=i, phase="ARCHIVED", type="KOTH") for i in range(1, 4)]

    result = parse_contest_list({"status": "OK", "result": entries})

    assert {(r.phase, r.type) for r in result.records} == {("ARCHIVED", "KOTH")}
    messages = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert messages == [
        "Codeforces: unknown contest phase 'ARCHIVED' (3 contests) kept as is",
        "Codeforces: unknown contest type 'KOTH' (3 contests) kept as is",
    ]


@pytest.mark.parametrize(
    ("payload", "message"),
    [
        ([], "answer is a list, not a JSON object"),
        ({"status": "OK", "result": {"id": 1}}, "'result' is a dict, not a list of contests"),
        ({"status": "OK"}, "'result' is a NoneType, not a list of contests"),
        ({"status": "FAILED", "comment": "nope"}, "answered status 'FAILED': nope"),
    ],
)
def test_an_unusable_answer_raises(payload, message):
    with pytest.raises(CodeforcesError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_contest_list(payload)


def test_mostly_invalid_raises():
    entries = [_entry(id=1), _entry(id=2), _entry(id=-1), _entry(id=-2), _entry(id=-3)]

    with pytest.raises(CodeforcesError, match=r"mostly invalid: 3 of 5 entries rejected"):
        parse_contest_list({"status": "OK", "result": entries})


def test_exactly_half_invalid_is_accepted():
    entries = [_entry(id=1), _entry(id=2), _entry(id=-1), _entry(id=-2)]
    assert parse_contest_list({"status": "OK", "result": entries}).invalid == 2
