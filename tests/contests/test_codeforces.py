"""The Codeforces client against a real local HTTP server."""

import json
import logging
from datetime import UTC, datetime, timedelta

import pytest

from contests.codeforces import USER_AGENT, CodeforcesClient, CodeforcesError, parse_contest_list

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
    with pytest.raises(CodeforcesError, match=r"cannot connect .* \(3 attempts\): Connection refused"):
        CodeforcesClient(base_url="http://127.0.0.1:9/api", backoff=0).contest_list()


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
        "Codeforces: unknown contest phase 'ARCHIVED' kept as is",
        "Codeforces: unknown contest type 'KOTH' kept as is",
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
