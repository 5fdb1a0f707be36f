"""``locks.contrib.alerts`` is an optional app (issue 25): a host project without it migrates,
passes its checks, runs its jobs and answers /healthz and /metrics with no incident and no
check_jobs (real processes, a database of its own); its migrations and locks 0010 move the
model's state only, so the table and its rows survive them forwards and backwards."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from django.contrib.auth.models import Group, Permission
from django.contrib.contenttypes.models import ContentType
from django.core.management import call_command
from django.db import connection

from locks.contrib.alerts.models import Incident
from locks.models import database_now
from tests.conftest import ROOT, project_env

HOST_MANAGE = ROOT / "tests" / "hostproject" / "manage.py"
TOKEN = "t" * 32
# What a process of the host project sees of the alerts, /healthz and /metrics.
PROBE = f"""
import json, django
django.setup()
from django.apps import apps
from django.conf import settings
from django.db import connection
from django.test import Client
from locks.registry import jobs
settings.LOCKS_HEALTHZ_TOKEN = settings.LOCKS_METRICS_TOKEN = {TOKEN!r}
auth = {{"HTTP_AUTHORIZATION": "Bearer {TOKEN}"}}
healthz = Client().get("/healthz", **auth)
metrics = Client().get("/metrics", **auth)
print(json.dumps({{
    "installed": apps.is_installed("locks.contrib.alerts"),
    "jobs": list(jobs()),
    "table": "locks_incident" in connection.introspection.table_names(),
    "healthz": healthz.json(),
    "metrics": [line for line in metrics.content.decode().splitlines() if line.startswith("locks_job_incident_open")],
}}))
"""


def host(*args: str, env: dict[str, str]) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], cwd=ROOT, env=env, capture_output=True, text=True, timeout=120
    )


@pytest.fixture
def without_alerts(tmp_path) -> dict[str, str]:
    """The host project without locks.contrib.alerts, on an SQLite file of its own (a fresh database)."""
    env = project_env(HOSTPROJECT_VAR=str(tmp_path), HOSTPROJECT_ALERTS="0", HOSTPROJECT_JOBS="write_slot")
    env.pop("DATABASE_URL", None)
    env["DJANGO_SETTINGS_MODULE"] = "tests.hostproject.settings"
    return env


def test_a_project_without_the_alerts_app_migrates_checks_runs_and_shows_no_incident(without_alerts):
    migrated = host(str(HOST_MANAGE), "migrate", env=without_alerts)
    assert migrated.returncode == 0, migrated.stderr
    assert "locks.0010_incident_to_contrib_alerts... OK" in migrated.stdout
    assert "locks_alerts" not in migrated.stdout
    checked = host(str(HOST_MANAGE), "check", env=without_alerts)
    assert checked.returncode == 0 and "no issues" in checked.stdout, checked.stderr
    assert host(str(HOST_MANAGE), "run_job", "write_slot", env=without_alerts).returncode == 0
    unknown = host(str(HOST_MANAGE), "run_job", "check_jobs", env=without_alerts)
    assert unknown.returncode == 2 and "no job named 'check_jobs'" in unknown.stderr

    probe = host("-c", PROBE, env=without_alerts)
    assert probe.returncode == 0, probe.stderr
    seen = json.loads(probe.stdout)
    assert (seen["installed"], seen["jobs"], seen["table"]) == (
        False,
        ["write_slot"],
        True,
    )  # the table stays
    assert seen["healthz"]["jobs"]["write_slot"]["incident"] is None
    assert seen["metrics"] == ['locks_job_incident_open{job="write_slot"} 0.0']


def test_the_alerts_app_added_later_takes_the_table_over_and_check_jobs_runs(without_alerts):
    assert host(str(HOST_MANAGE), "migrate", env=without_alerts).returncode == 0  # locks 0010 first
    with_alerts = {**without_alerts, "HOSTPROJECT_ALERTS": "1"}

    migrated = host(str(HOST_MANAGE), "migrate", env=with_alerts)

    assert migrated.returncode == 0, migrated.stderr
    assert "locks_alerts.0001_initial... OK" in migrated.stdout
    ran = host(str(HOST_MANAGE), "run_job", "check_jobs", env=with_alerts)
    assert ran.returncode == 0, ran.stderr
    seen = json.loads(host("-c", PROBE, env=with_alerts).stdout)
    assert (seen["installed"], seen["jobs"]) == (True, ["write_slot", "check_jobs"])


def sql_of(app: str, migration: str, *, backwards: bool = False) -> str:
    return call_command("sqlmigrate", app, migration, backwards=backwards)


@pytest.mark.django_db(transaction=True)
def test_the_move_is_state_only_and_the_rows_survive_it_forwards_and_backwards():
    for app, migration in (("locks", "0010"), ("locks_alerts", "0001")):
        for backwards in (False, True):
            lines = sql_of(app, migration, backwards=backwards).splitlines()
            statements = [line for line in lines if line and not line.startswith("--")]
            assert set(statements) <= {"BEGIN;", "COMMIT;"}, (app, migration, backwards)
    Incident.objects.create(
        job_name="record", reason="failed", summary="2 slots failed", opened_at=database_now()
    )

    call_command("migrate", "locks_alerts", "zero", verbosity=0)
    call_command("migrate", "locks", "0009", verbosity=0)  # Incident is the locks app's again
    assert "locks_incident" in connection.introspection.table_names()
    call_command("migrate", verbosity=0)

    assert list(Incident.objects.values_list("job_name", "reason")) == [("record", "failed")]
    call_command("makemigrations", "--check", "--dry-run", verbosity=0)  # no change left to make


@pytest.mark.django_db(transaction=True)
def test_permissions_granted_on_incidents_move_with_the_model():
    """An upgraded database's ``locks.incident`` content type becomes ``locks_alerts.incident``:
    a group's ``view_incident`` grant is kept (and goes back with a migration backwards)."""

    def grants() -> list[tuple[str, str]]:
        return list(
            Group.objects.get(name="on call").permissions.values_list("content_type__app_label", "codename")
        )

    on_call = Group.objects.create(name="on call")
    on_call.permissions.add(
        Permission.objects.get(content_type__app_label="locks_alerts", codename="view_incident")
    )

    call_command("migrate", "locks_alerts", "zero", verbosity=0)
    assert grants() == [("locks", "view_incident")]  # as a database before the move had it
    call_command("migrate", verbosity=0)

    assert grants() == [("locks_alerts", "view_incident")]
    assert not ContentType.objects.filter(app_label="locks", model="incident").exists()
