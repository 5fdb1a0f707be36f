"""The locks app's system checks: one id per problem, each message a constant
(locks/checks.py, locks/registry.py), all tagged `locks`."""

import re
from datetime import timedelta

import pytest
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from locks import checks, registry
from locks.checks import CHECK_TAG
from locks.registry import get_job, jobs


def _ids() -> set[str]:
    return {message.id for message in run_checks()}


def test_default_settings_pass():
    assert not {i for i in _ids() if i.startswith("locks.")}


def test_a_host_that_sets_no_lock_setting_passes_every_check(settings):
    """The host project sets only LOCKS_JOBS and LOCKS_HEALTHZ_JOB; the rest are locks/conf.py's."""
    from tests.hostproject import settings as host

    assert not set(checks.NUMBERS) & set(vars(host))
    assert [m.id for m in run_checks(tags=[CHECK_TAG]) if m.id.startswith("locks.")] == []


@pytest.mark.parametrize("ttl", [0, -1])
def test_a_bad_default_ttl_fails_the_check(settings, ttl):
    settings.LOCKS_DEFAULT_TTL = ttl
    [error] = [m for m in run_checks() if m.id == "locks.E001"]
    assert f"got {ttl!r}" in error.msg


def test_a_bad_retention_fails_the_check(settings):
    settings.LOCKS_RUN_RETENTION_DAYS = 0
    assert "locks.E002" in _ids()


@pytest.mark.parametrize("window", [-1, 1.5, "300", None, True])
def test_a_bad_tick_window_fails_the_check(settings, window):
    settings.LOCKS_TICK_WINDOW = window
    [error] = [m for m in run_checks() if m.id == "locks.E003"]
    assert f"LOCKS_TICK_WINDOW must be a whole number of seconds, 0 or more, got {window!r}." == error.msg


@pytest.mark.parametrize(
    ("name", "value", "code", "message"),
    [
        (
            "LOCKS_DEFAULT_TTL",
            "300",
            "locks.E001",
            "LOCKS_DEFAULT_TTL must be a whole number of seconds, 1 or more, got '300'.",
        ),
        (
            "LOCKS_RUN_RETENTION_DAYS",
            0,
            "locks.E002",
            "LOCKS_RUN_RETENTION_DAYS must be a whole number of days, 1 or more, got 0.",
        ),
        (
            "LOCKS_MAX_CLOCK_SKEW",
            -1,
            "locks.E004",
            "LOCKS_MAX_CLOCK_SKEW must be a whole number of seconds, 0 or more, got -1.",
        ),
        (
            "LOCKS_SCHEDULER_GRACE",
            2.5,
            "locks.E005",
            "LOCKS_SCHEDULER_GRACE must be a whole number of seconds, 0 or more, got 2.5.",
        ),
        (
            "LOCKS_TRIGGER_RATE_WINDOW",
            0,
            "locks.E006",
            "LOCKS_TRIGGER_RATE_WINDOW must be a whole number of seconds, 1 or more, got 0.",
        ),
        (
            "LOCKS_TRUSTED_PROXY_COUNT",
            -1,
            "locks.E007",
            "LOCKS_TRUSTED_PROXY_COUNT must be a whole number of proxies, 0 or more, got -1.",
        ),
        (
            "LOCKS_SCHEDULER_WORKERS",
            -1,
            "locks.E037",
            "LOCKS_SCHEDULER_WORKERS must be a whole number of processes, 0 or more, got -1.",
        ),
        (
            "LOCKS_SCHEDULER_WORKERS",
            "4",
            "locks.E037",
            "LOCKS_SCHEDULER_WORKERS must be a whole number of processes, 0 or more, got '4'.",
        ),
    ],
)
def test_each_numeric_setting_has_its_own_check(settings, name, value, code, message):
    setattr(settings, name, value)
    assert [(m.id, m.msg) for m in run_checks(tags=[CHECK_TAG]) if m.id.startswith("locks.")] == [
        (code, message)
    ]


def test_the_checks_are_tagged_locks_and_run_job_selects_that_tag(settings):
    """run_job runs the `locks` checks (the lock's, and any a project tags the same), not
    every check: a bad LOCKS_JOBS stops it before it runs anything."""
    settings.LOCKS_DEFAULT_TTL = 0
    assert "locks.E001" in {m.id for m in run_checks(tags=[CHECK_TAG])}
    assert "locks.E001" not in {m.id for m in run_checks(tags=["compatibility"])}
    with pytest.raises(SystemCheckError, match=r"\(locks\.E001\) LOCKS_DEFAULT_TTL must be"):
        call_command("run_job", "record", "--dry-run", skip_checks=False)


def _templates(message: str) -> set[str]:
    """The message constants of locks/checks.py and locks/registry.py that ``message`` fills in."""
    constants = {
        f"{module.__name__}.{name}": value
        for module in (checks, registry)
        for name, value in vars(module).items()
        if name.isupper() and isinstance(value, str) and "{" in value
    }
    return {
        name
        for name, template in constants.items()
        if re.fullmatch(re.sub(r"\\\{[^}]*\\\}", ".*", re.escape(template)), message)
    }


def test_each_check_id_speaks_for_one_problem_in_one_message():
    """Every refusal's text is a message constant, and no id is used for two of them."""
    by_code: dict[str, set[str]] = {}
    for _jobs, code, message in BAD_JOB_SETTINGS:
        templates = _templates(message)
        assert templates, message
        by_code.setdefault(code, set()).update(templates)
    assert {code: names for code, names in by_code.items() if len(names) > 1} == {}
    # a case for every LOCKS_JOBS id
    assert sorted(by_code) == [*(f"locks.E0{n}" for n in range(10, 26)), "locks.E033"]
    assert len({code for code, *_ in checks.NUMBERS.values()}) == len(checks.NUMBERS)


# --- LOCKS_JOBS ---------------------------------------------------------------------------

GOOD = {"schedule": "*/5 * * * *", "callable": "tests.jobsapp.jobs.record", "ttl": 60, "max_run_time": 120}


def _job_errors(settings, jobs) -> list[tuple[str, str]]:
    settings.LOCKS_JOBS = jobs
    return [(m.id, m.msg) for m in run_checks() if m.id.startswith(("locks.E01", "locks.E02", "locks.E033"))]


def test_the_registered_jobs_pass(settings):
    assert settings.LOCKS_JOBS
    assert _job_errors(settings, settings.LOCKS_JOBS) == []


BAD_JOB_SETTINGS = [
    (
        [("record", GOOD)],
        "locks.E010",
        "LOCKS_JOBS must be a dict of job name to job settings, got list.",
    ),
    ({"record": "*/5 * * * *"}, "locks.E018", "LOCKS_JOBS['record'] must be a dict, got str."),
    (
        {"record": {**GOOD, "schedlue": "0 * * * *", "every": 5}},
        "locks.E019",
        "LOCKS_JOBS['record'] has unknown keys: every, schedlue.",
    ),
    (
        {"record": {**GOOD, "expected_errors": "tests.jobsapp.jobs.Refused"}},
        "locks.E020",
        "LOCKS_JOBS['record']: expected_errors must be a list of dotted paths of exception classes, "
        "got 'tests.jobsapp.jobs.Refused'.",
    ),
    (
        {"record": {**GOOD, "schedule": "61 * * * *"}},
        "locks.E011",
        "LOCKS_JOBS['record']: schedule '61 * * * *' is not a valid cron expression.",
    ),
    (
        {"record": {"callable": "tests.jobsapp.jobs.record"}},
        "locks.E011",
        "LOCKS_JOBS['record']: schedule None is not a valid cron expression.",
    ),
    (
        {"record": {**GOOD, "callable": "tests.locks.nowhere.record"}},
        "locks.E021",
        "LOCKS_JOBS['record']: callable 'tests.locks.nowhere.record' cannot be imported: "
        "ModuleNotFoundError: No module named 'tests.locks.nowhere'.",
    ),
    (
        {"record": {**GOOD, "callable": "tests.jobsapp.jobs.missing"}},
        "locks.E021",
        "LOCKS_JOBS['record']: callable 'tests.jobsapp.jobs.missing' cannot be imported: ImportError: "
        'Module "tests.jobsapp.jobs" does not define a "missing" attribute/class.',
    ),
    (
        {"record": {**GOOD, "callable": "tests.hostproject.settings.RECORD"}},
        "locks.E022",
        "LOCKS_JOBS['record']: callable 'tests.hostproject.settings.RECORD' is not callable.",
    ),
    (
        {"record": {k: v for k, v in GOOD.items() if k != "callable"}},
        "locks.E012",
        "LOCKS_JOBS['record']: callable must be the dotted path of a function, got None.",
    ),
    (
        {"record": {**GOOD, "dry_run": "tests.jobsapp.jobs.nope"}},
        "locks.E021",
        "LOCKS_JOBS['record']: dry_run 'tests.jobsapp.jobs.nope' cannot be imported: ImportError: "
        'Module "tests.jobsapp.jobs" does not define a "nope" attribute/class.',
    ),
    (
        {"record": {**GOOD, "expected_errors": ["tests.jobsapp.jobs.record"]}},
        "locks.E023",
        "LOCKS_JOBS['record']: expected error 'tests.jobsapp.jobs.record' is not an exception class.",
    ),
    (
        {"record": {**GOOD, "ttl": 0}},
        "locks.E013",
        "LOCKS_JOBS['record']: ttl must be a positive whole number of seconds, got 0.",
    ),
    (
        {"record": {**GOOD, "ttl": "60"}},
        "locks.E013",
        "LOCKS_JOBS['record']: ttl must be a positive whole number of seconds, got '60'.",
    ),
    (
        {"record": {**GOOD, "ttl": True}},
        "locks.E013",
        "LOCKS_JOBS['record']: ttl must be a positive whole number of seconds, got True.",
    ),
    (
        {"record": {**GOOD, "max_run_time": -5}},
        "locks.E014",
        "LOCKS_JOBS['record']: max_run_time must be a positive whole number of seconds, got -5.",
    ),
    (
        {"record": {**GOOD, "max_run_time": 1.5}},
        "locks.E014",
        "LOCKS_JOBS['record']: max_run_time must be a positive whole number of seconds, got 1.5.",
    ),
    (
        {"record": {**GOOD, "retry": [60, 300]}},
        "locks.E015",
        "LOCKS_JOBS['record']: retry must be {'delays': [seconds, ...]} with positive whole seconds, "
        "got [60, 300].",
    ),
    (
        {"record": {**GOOD, "retry": {"delays": [60, 0]}}},
        "locks.E015",
        "LOCKS_JOBS['record']: retry must be {'delays': [seconds, ...]} with positive whole seconds, "
        "got {'delays': [60, 0]}.",
    ),
    (
        {"record": {**GOOD, "retry": {"delays": [60], "max": 3}}},
        "locks.E015",
        "LOCKS_JOBS['record']: retry must be {'delays': [seconds, ...]} with positive whole seconds, "
        "got {'delays': [60], 'max': 3}.",
    ),
    (
        {"record": {**GOOD, "catch_up": "every"}},
        "locks.E024",
        "LOCKS_JOBS['record']: catch_up must be 'latest' or 'all', got 'every'.",
    ),
    (
        {"record": {**GOOD, "catch_up": ["all"]}},
        "locks.E024",
        "LOCKS_JOBS['record']: catch_up must be 'latest' or 'all', got ['all'].",
    ),
    (
        {"record": {**GOOD, "catch_up": "all", "catch_up_window": 0}},
        "locks.E025",
        "LOCKS_JOBS['record']: catch_up_window must be a positive whole number of seconds, got 0.",
    ),
    (
        {"record": {**GOOD, "catch_up_window": "1d"}},
        "locks.E025",
        "LOCKS_JOBS['record']: catch_up_window must be a positive whole number of seconds, got '1d'.",
    ),
    (
        {"record": {**GOOD, "timezone": "Europe/Berlín"}},
        "locks.E033",
        "LOCKS_JOBS['record']: timezone 'Europe/Berlín' is not an IANA time zone this host knows.",
    ),
    (
        {"record": {**GOOD, "timezone": "CEST"}},
        "locks.E033",
        "LOCKS_JOBS['record']: timezone 'CEST' is not an IANA time zone this host knows.",
    ),
    (
        {"record": {**GOOD, "timezone": None}},
        "locks.E033",
        "LOCKS_JOBS['record']: timezone None is not an IANA time zone this host knows.",
    ),
    (
        {"record": GOOD, " Record": GOOD},
        "locks.E017",
        "LOCKS_JOBS names 'record' and ' Record': two spellings of one job.",
    ),
    ({"send reminders": GOOD}, "locks.E016", "LOCKS_JOBS: 'send reminders' is not a valid job name."),
    ({"x" * 101: GOOD}, "locks.E016", f"LOCKS_JOBS: {'x' * 101!r} is not a valid job name."),
    ({"": GOOD}, "locks.E016", "LOCKS_JOBS: '' is not a valid job name."),
    ({7: GOOD}, "locks.E016", "LOCKS_JOBS: 7 is not a valid job name."),
]


@pytest.mark.parametrize(("jobs", "code", "message"), BAD_JOB_SETTINGS)
def test_a_bad_job_setting_fails_the_check(settings, jobs, code, message):
    assert _job_errors(settings, jobs) == [(code, message)]


def test_every_problem_of_an_entry_is_reported(settings):
    errors = _job_errors(settings, {"Bad Name": {"schedule": "x", "callable": "", "ttl": 0, "retry": 5}})
    assert [code for code, _ in errors] == [
        "locks.E016",
        "locks.E011",
        "locks.E012",
        "locks.E013",
        "locks.E015",
    ]


def test_the_catch_up_keys_are_read_into_the_job_with_their_defaults(settings):
    settings.LOCKS_JOBS = {
        "daily": {**GOOD, "catch_up": "all", "catch_up_window": 3600, "retry": {"delays": [5, 10]}},
        "plain": GOOD,
    }
    assert _job_errors(settings, settings.LOCKS_JOBS) == []
    daily, plain = jobs()["daily"], jobs()["plain"]
    assert (*daily.catch_up, daily.max_attempts) == ("all", timedelta(hours=1), 3)
    assert (*plain.catch_up, plain.max_attempts) == ("latest", timedelta(days=1), 1)


def test_optional_keys_may_be_left_out(settings):
    assert (
        _job_errors(settings, {"a-b_1": {"schedule": "0 3 * * 1-5", "callable": "tests.jobsapp.jobs.record"}})
        == []
    )


def test_an_unknown_time_zone_names_the_fix_in_its_hint(settings):
    settings.LOCKS_JOBS = {"record": {**GOOD, "timezone": "Europe/Paris "}}
    [error] = [e for e in run_checks(tags=[CHECK_TAG]) if e.id == "locks.E033"]
    assert "'Europe/Berlin'" in error.hint and "UTC" in error.hint


def test_a_known_time_zone_passes_and_reaches_the_job(settings):
    settings.LOCKS_JOBS = {"record": {**GOOD, "timezone": "Pacific/Chatham"}}
    assert not [e for e in run_checks(tags=[CHECK_TAG]) if e.id.startswith("locks.")]
    assert get_job("record").cron.timezone == "Pacific/Chatham"
    settings.LOCKS_JOBS = {"record": GOOD}
    assert get_job("record").cron.timezone == "UTC"  # every job without the key keeps its UTC slots
