"""`manage.py locks next JOB`: a job's next slots in UTC and in its zone, marked where the DST
rule applied (docs/jobs.md, "Time zones and DST")."""

from __future__ import annotations

import json
import subprocess
import sys
from io import StringIO

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from tests.conftest import ROOT, project_env

BERLIN = {"schedule": "30 2 * * *", "timezone": "Europe/Berlin", "callable": "tests.jobsapp.jobs.record"}
HOURLY = {"schedule": "0 * * * *", "timezone": "Europe/Berlin", "callable": "tests.jobsapp.jobs.record"}


@pytest.fixture
def berlin_jobs(settings):
    settings.LOCKS_JOBS = {"digest": BERLIN, "hourly": HOURLY}


def next_slots(*args: str) -> str:
    out = StringIO()
    call_command("locks", "next", *args, stdout=out)
    return out.getvalue()


def test_the_json_names_each_slot_in_utc_and_local_and_marks_the_dst_rule(berlin_jobs):
    spring = json.loads(
        next_slots("digest", "--count", "3", "--after", "2027-03-27T12:00:00+00:00", "--json")
    )
    assert spring == [
        {"slot": "2027-03-28T01:00:00+00:00", "local": "2027-03-28T03:00:00+02:00", "dst": "gap"},
        {"slot": "2027-03-29T00:30:00+00:00", "local": "2027-03-29T02:30:00+02:00", "dst": None},
        {"slot": "2027-03-30T00:30:00+00:00", "local": "2027-03-30T02:30:00+02:00", "dst": None},
    ]
    fall = json.loads(next_slots("hourly", "--count", "3", "--after", "2027-10-31T01:59+02:00", "--json"))
    assert fall == [
        {"slot": "2027-10-31T00:00:00+00:00", "local": "2027-10-31T02:00:00+02:00", "dst": "repeat"},
        {"slot": "2027-10-31T01:00:00+00:00", "local": "2027-10-31T02:00:00+01:00", "dst": "repeat"},
        {"slot": "2027-10-31T02:00:00+00:00", "local": "2027-10-31T03:00:00+01:00", "dst": None},
    ]


def test_after_is_exclusive_and_a_naive_one_is_utc(berlin_jobs):
    [first] = json.loads(next_slots("hourly", "--count", "1", "--after", "2027-10-31T00:00:00", "--json"))
    assert first["slot"] == "2027-10-31T01:00:00+00:00"


def test_the_table_shows_the_zone_and_its_abbreviation(berlin_jobs):
    lines = next_slots("digest", "--count", "2", "--after", "2027-03-27T12:00Z").splitlines()
    assert lines[0] == "digest: '30 2 * * *' in Europe/Berlin"
    assert lines[1].split() == ["SLOT", "(UTC)", "LOCAL", "DST"]
    assert lines[2].split() == ["2027-03-28T01:00:00+00:00", "2027-03-28", "03:00", "CEST", "(+0200)", "gap"]
    assert lines[3].split() == ["2027-03-29T00:30:00+00:00", "2027-03-29", "02:30", "CEST", "(+0200)", "-"]


def test_without_after_the_slots_follow_now(berlin_jobs):
    slots = json.loads(next_slots("hourly", "--json"))
    assert len(slots) == 10  # the default
    assert all(slot["slot"].endswith(":00:00+00:00") for slot in slots)


def test_a_thousand_slots_at_most(berlin_jobs):
    assert len(json.loads(next_slots("hourly", "--count", "1000", "--json"))) == 1000
    with pytest.raises(CommandError, match="'1001' is not a whole number of slots from 1 to 1000"):
        next_slots("hourly", "--count", "1001")
    with pytest.raises(CommandError, match="'0' is not a whole number of slots from 1 to 1000"):
        next_slots("hourly", "--count", "0")


def test_slots_beyond_year_9999_are_refused_with_exit_2(berlin_jobs):
    with pytest.raises(CommandError, match=r"do not all lie within the years 1 to 9999") as refused:
        next_slots("hourly", "--after", "9999-12-31T22:00:00+00:00", "--count", "5")
    assert refused.value.returncode == 2


def test_an_unknown_job_or_a_bad_after_exits_2_with_one_line_and_writes_nothing(db_url):
    env = project_env(DATABASE_URL=db_url, DJANGO_SETTINGS_MODULE="tests.hostproject.settings")
    manage = [sys.executable, str(ROOT / "tests" / "hostproject" / "manage.py"), "locks", "next"]
    for args, said in (
        (["nope"], "CommandError: no job named 'nope' in LOCKS_JOBS (registered: write_slot, "),
        (["write_slot", "--after", "soon"], "error: argument --after: 'soon' is not an ISO 8601 date-time"),
    ):
        done = subprocess.run([*manage, *args], env=env, capture_output=True, text=True, timeout=60)
        assert (done.returncode, done.stdout) == (2, ""), done.stderr
        assert said in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
