import pytest
from django.core.checks import run_checks


def _ids() -> set[str]:
    return {message.id for message in run_checks()}


def test_default_settings_pass():
    assert not {i for i in _ids() if i.startswith(("locks.", "contests."))}


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


def test_a_zero_tick_window_passes(settings):
    settings.LOCKS_TICK_WINDOW = 0
    assert "locks.E003" not in _ids()


def test_a_non_positive_sync_max_run_time_fails_the_check_of_its_job():
    """SYNC_CONTESTS_MAX_RUN_TIME reaches the sync's LOCKS_JOBS entry, whose check refuses it."""
    from tests.conftest import manage, project_env

    proc = manage("check", env=project_env(SYNC_CONTESTS_MAX_RUN_TIME="0"))
    assert proc.returncode == 1
    assert "(locks.E014) LOCKS_JOBS['sync_contests']: max_run_time" in proc.stderr, proc.stderr


@pytest.mark.parametrize("job", ["SYNC_CONTESTS", "SEND_REMINDERS"])
def test_a_bad_schedule_or_ttl_is_one_error_on_its_job(job):
    """The environment variables reach the job's LOCKS_JOBS entry; its check names each problem once."""
    from tests.conftest import manage, project_env

    proc = manage("check", env=project_env(**{f"{job}_SCHEDULE": "0 25 * * *", f"{job}_LOCK_TTL": "0"}))

    name = job.lower()
    assert proc.returncode == 1
    assert proc.stderr.count("is not a valid cron expression") == 1, proc.stderr
    assert f"(locks.E011) LOCKS_JOBS['{name}']: schedule '0 25 * * *'" in proc.stderr
    assert f"(locks.E013) LOCKS_JOBS['{name}']: ttl" in proc.stderr


# --- LOCKS_JOBS ---------------------------------------------------------------------------

GOOD = {"schedule": "*/5 * * * *", "callable": "tests.locks.jobs.record", "ttl": 60, "max_run_time": 120}


def _job_errors(settings, jobs) -> list[tuple[str, str]]:
    settings.LOCKS_JOBS = jobs
    return [(m.id, m.msg) for m in run_checks() if m.id.startswith("locks.E01")]


def test_the_registered_jobs_pass(settings):
    from tests.locks.jobs import TEST_JOBS

    assert _job_errors(settings, {**settings.LOCKS_JOBS, **TEST_JOBS}) == []


@pytest.mark.parametrize(
    ("jobs", "code", "message"),
    [
        (
            [("record", GOOD)],
            "locks.E010",
            "LOCKS_JOBS must be a dict of job name to job settings, got list.",
        ),
        ({"record": "*/5 * * * *"}, "locks.E010", "LOCKS_JOBS['record'] must be a dict, got str."),
        (
            {"record": {**GOOD, "schedlue": "0 * * * *", "every": 5}},
            "locks.E010",
            "LOCKS_JOBS['record'] has unknown keys: every, schedlue.",
        ),
        (
            {"record": {**GOOD, "expected_errors": "tests.locks.jobs.Refused"}},
            "locks.E010",
            "LOCKS_JOBS['record']: expected_errors must be a list of dotted paths of exception classes, "
            "got 'tests.locks.jobs.Refused'.",
        ),
        (
            {"record": {**GOOD, "schedule": "61 * * * *"}},
            "locks.E011",
            "LOCKS_JOBS['record']: schedule '61 * * * *' is not a valid cron expression.",
        ),
        (
            {"record": {"callable": "tests.locks.jobs.record"}},
            "locks.E011",
            "LOCKS_JOBS['record']: schedule None is not a valid cron expression.",
        ),
        (
            {"record": {**GOOD, "callable": "tests.locks.nowhere.record"}},
            "locks.E012",
            "LOCKS_JOBS['record']: callable 'tests.locks.nowhere.record' cannot be imported: "
            "ModuleNotFoundError: No module named 'tests.locks.nowhere'.",
        ),
        (
            {"record": {**GOOD, "callable": "tests.locks.jobs.missing"}},
            "locks.E012",
            "LOCKS_JOBS['record']: callable 'tests.locks.jobs.missing' cannot be imported: ImportError: "
            'Module "tests.locks.jobs" does not define a "missing" attribute/class.',
        ),
        (
            {"record": {**GOOD, "callable": "tests.locks.jobs.TEST_JOBS"}},
            "locks.E012",
            "LOCKS_JOBS['record']: callable 'tests.locks.jobs.TEST_JOBS' is not callable.",
        ),
        (
            {"record": {k: v for k, v in GOOD.items() if k != "callable"}},
            "locks.E012",
            "LOCKS_JOBS['record']: callable must be the dotted path of a function, got None.",
        ),
        (
            {"record": {**GOOD, "dry_run": "tests.locks.jobs.nope"}},
            "locks.E012",
            "LOCKS_JOBS['record']: dry_run 'tests.locks.jobs.nope' cannot be imported: ImportError: "
            'Module "tests.locks.jobs" does not define a "nope" attribute/class.',
        ),
        (
            {"record": {**GOOD, "expected_errors": ["tests.locks.jobs.record"]}},
            "locks.E012",
            "LOCKS_JOBS['record']: expected error 'tests.locks.jobs.record' is not an exception class.",
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
            {"record": GOOD, " Record": GOOD},
            "locks.E016",
            "LOCKS_JOBS names 'record' and ' Record': two spellings of one job.",
        ),
        ({"send reminders": GOOD}, "locks.E016", "LOCKS_JOBS: 'send reminders' is not a valid job name."),
        ({"x" * 101: GOOD}, "locks.E016", f"LOCKS_JOBS: {'x' * 101!r} is not a valid job name."),
        ({"": GOOD}, "locks.E016", "LOCKS_JOBS: '' is not a valid job name."),
        ({7: GOOD}, "locks.E016", "LOCKS_JOBS: 7 is not a valid job name."),
    ],
)
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


def test_optional_keys_may_be_left_out(settings):
    assert (
        _job_errors(settings, {"a-b_1": {"schedule": "0 3 * * 1-5", "callable": "tests.locks.jobs.record"}})
        == []
    )


def test_manage_py_check_names_a_bad_job_setting():
    from tests.conftest import manage, project_env

    proc = manage("check", env=project_env(SYNC_CONTESTS_MAX_RUN_TIME="0"))

    assert proc.returncode == 1
    assert (
        "(locks.E014) LOCKS_JOBS['sync_contests']: max_run_time must be a positive whole number of seconds, got 0."
        in proc.stderr
    )
