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


@pytest.mark.parametrize("expression", ["every hour", "61 * * * *", "", None])
def test_a_bad_schedule_fails_the_check(settings, expression):
    settings.SYNC_CONTESTS_SCHEDULE = expression
    [error] = [m for m in run_checks() if m.id == "contests.E001"]
    assert "is not a valid cron expression" in error.msg


@pytest.mark.parametrize("ttl", [0, -60])
def test_a_non_positive_sync_ttl_fails_the_check(settings, ttl):
    settings.SYNC_CONTESTS_LOCK_TTL = ttl
    assert "contests.E002" in _ids()


@pytest.mark.parametrize("seconds", [0, -1])
def test_a_non_positive_sync_max_run_time_fails_the_check(settings, seconds):
    settings.SYNC_CONTESTS_MAX_RUN_TIME = seconds
    [error] = [m for m in run_checks() if m.id == "contests.E003"]
    assert error.msg == f"SYNC_CONTESTS_MAX_RUN_TIME must be a positive number of seconds, got {seconds!r}."


def test_manage_py_check_fails_with_the_code(tmp_path):
    from tests.conftest import manage, project_env

    proc = manage("check", env=project_env(SYNC_CONTESTS_SCHEDULE="0 25 * * *", SYNC_CONTESTS_LOCK_TTL="0"))

    assert proc.returncode == 1
    assert "contests.E001" in proc.stderr
    assert "contests.E002" in proc.stderr
