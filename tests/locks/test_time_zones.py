"""A job read in its own time zone, where people look (``locks status``, ``locks ticks``, the
admin's job page, its tick strip and its next slots) and across a deploy that changes its zone
or schedule (docs/jobs.md, "Time zones and DST").

The night shown is 2026-03-29 in Europe/Berlin (02:00 CET -> 03:00 CEST at 01:00 UTC): in the
past, so its slot is one a run may claim on the database's real clock.
"""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta
from io import StringIO

import pytest
from django.core.management import call_command
from django.urls import reverse

from locks.lease import acquire, release
from locks.models import JobRun, Outcome, SyncLock
from locks.runner import run_job
from locks.schedule import InvalidTick
from tests.jobsapp.models import SlotWrite

pytestmark = pytest.mark.django_db(transaction=True)

DIGEST = {
    "schedule": "30 2 * * *",
    "timezone": "Europe/Berlin",
    "callable": "tests.jobsapp.jobs.write_slot",
    "ttl": 60,
}
SPRING = datetime(2026, 3, 29, 1, 0, tzinfo=UTC)  # 03:00 CEST: 02:30 did not exist that night


@pytest.fixture
def digest(settings):
    settings.LOCKS_JOBS = {"digest": DIGEST}
    settings.LOCKS_CHECK_JOBS = False
    release(
        lease=acquire(job="digest", tick=SPRING, ttl=timedelta(minutes=1), holder="h:1:a"), status="succeeded"
    )
    JobRun.objects.create(
        job_name="digest", tick=SPRING, holder="h:1:a", token=1, started_at=SPRING, status=Outcome.SUCCEEDED
    )
    # The job existed before the slots these tests read (the ledger starts with its lock row).
    SyncLock.objects.filter(job_name="digest").update(created_at=SPRING - timedelta(days=2))


def command(*args: str) -> str:
    out = StringIO()
    call_command("locks", *args, stdout=out)
    return out.getvalue()


def test_status_shows_the_tick_in_the_jobs_zone_and_keeps_utc_in_its_json(digest):
    [line] = [line for line in command("status").splitlines() if line.startswith("digest ")]
    assert "2026-03-29 03:00 CEST" in line
    [entry] = json.loads(command("status", "--json"))
    assert (entry["tick"], entry["tick_local"], entry["timezone"]) == (
        "2026-03-29T01:00:00+00:00",
        "2026-03-29T03:00:00+02:00",
        "Europe/Berlin",
    )


def test_ticks_shows_each_slot_in_utc_and_in_the_jobs_zone(digest):
    table = command("ticks", "digest", "--last", "400").splitlines()
    assert table[0].split()[:4] == ["TICK", "(UTC)", "LOCAL", "(Europe/Berlin)"]
    [row] = [row for row in table if row.startswith("2026-03-29T01:00:00+00:00")]
    assert row.split()[1:5] == ["2026-03-29", "03:00", "CEST", "succeeded"]
    [slot] = [
        s
        for s in json.loads(command("ticks", "digest", "--last", "400", "--json"))
        if s["outcome"] == "succeeded"
    ]
    assert (slot["tick"], slot["local"]) == ("2026-03-29T01:00:00+00:00", "2026-03-29T03:00:00+02:00")
    before = [row for row in table if row.startswith("2026-03-28T")]
    assert before and before[0].split()[1:4] == ["2026-03-28", "02:30", "CET"]  # 01:30 UTC, the day before


def test_the_admin_job_page_shows_slots_in_the_jobs_zone_and_the_next_five(digest, admin_client, settings):
    settings.LOCKS_LEDGER_SLOTS = 400  # back to the spring night
    page = admin_client.get(reverse("admin:locks_synclock_change", args=[SyncLock.objects.get().pk]))
    html = page.content.decode()
    assert page.status_code == 200
    # the tick, its ledger row and its strip cell: local, with the UTC instant on hover
    assert '<span class="nowrap" title="2026-03-29T01:00:00+00:00">2026-03-29 03:00:00 CEST</span>' in html
    assert 'title="2026-03-29 03:00 CEST (01:00 UTC) succeeded"' in html
    next_slots = html.split('id="next-slots"')[1].split("</table>")[0]
    assert next_slots.count("<tr><td>") == 5
    assert next_slots.count("02:30:00 CET</span>") + next_slots.count("02:30:00 CEST</span>") == 5
    # Issue 38: every time the page shows (the lease, the runs, the ledger, the next slots) is in the
    # job's zone and in one format; UTC only in tooltips (title="…"), which the reader hovers.
    shown = re.sub(r'title="[^"]*"', "", html)
    assert "Every time on this page is in Europe/Berlin, the job's time zone." in html
    zones = re.findall(r"\b\d{4}-\d\d-\d\d \d\d:\d\d(?::\d\d)? ?(\w*)", shown)
    assert len(zones) > 20 and set(zones) == {"CET", "CEST"}, set(zones)
    assert not re.search(r"\b\d{4}-\d\d-\d\d \d\d:\d\d (?!\d)", shown)  # never without seconds


def test_a_changed_zone_follows_the_new_rule_at_once_and_never_runs_a_done_slot_again(digest, settings):
    """Deployed in UTC, the 02:30 UTC slot of 2026-11-29 ran; redeployed in Europe/Berlin
    (02:30 CET is 01:30 UTC), the slots are the new ones at once, and the earlier slot of that
    day, 01:30 UTC, is behind the tick already done: it is not run (no second run that night)."""
    settings.LOCKS_JOBS = {"digest": {**DIGEST, "timezone": "UTC"}}
    old = datetime(2026, 11, 29, 2, 30, tzinfo=UTC)
    assert run_job(name="digest", tick=old).outcome == "succeeded"

    settings.LOCKS_JOBS = {"digest": DIGEST}
    with pytest.raises(InvalidTick, match=r"is not a slot of the schedule '30 2 \* \* \*' \(Europe/Berlin\)"):
        run_job(name="digest", tick=old)
    same_night = run_job(name="digest", tick=datetime(2026, 11, 29, 1, 30, tzinfo=UTC))
    assert same_night.outcome == "skipped"
    following = run_job(name="digest", tick=datetime(2026, 11, 30, 1, 30, tzinfo=UTC))
    assert following.outcome == "succeeded"
    assert list(SlotWrite.objects.order_by("tick").values_list("tick", flat=True)) == [
        old,
        datetime(2026, 11, 30, 1, 30, tzinfo=UTC),
    ]
