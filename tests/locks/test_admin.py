"""The locks admin through Django's test client: permissions, state and
relative-time rendering (database clock), force release, read-only rows,
bounded queries, and the run history's retention."""

from __future__ import annotations

import re
from datetime import timedelta
from pathlib import Path

import pytest
from django.contrib.admin.models import CHANGE, LogEntry
from django.contrib.auth.models import Permission
from django.contrib.staticfiles import finders
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from locks.lease import Lease, LockLost, Skip, acquire, release, renew
from locks.models import JobRun, Outcome, SyncLock, Tick, now_plus
from locks.operator import force_release
from locks.runner import prune_runs, run_locked
from tests.locks.conftest import TICK, reschedule

pytestmark = pytest.mark.django_db

HOLDER = "web-1:4242:a1b2c3"
TTL = timedelta(seconds=30)
HOST_JOBS = ["write_slot", "record", "refuse", "linger", "slow_write"]  # then the app's own check_jobs
LIST_URL = reverse("admin:locks_synclock_changelist")
RUNS_URL = reverse("admin:locks_jobrun_changelist")


def held(job: str = "write_slot", *, ttl: timedelta = timedelta(minutes=4, seconds=30)) -> Lease:
    lease = acquire(job=job, tick=None, ttl=ttl, holder=HOLDER)
    assert isinstance(lease, Lease)
    return lease


def expired(job: str = "write_slot") -> Lease:
    """A holder that died: its lease ran out 3.5 minutes ago and was never released."""
    lease = held(job)
    SyncLock.objects.filter(job_name=job).update(
        locked_until=now_plus(-timedelta(minutes=3, seconds=30)), heartbeat_at=now_plus(-timedelta(minutes=9))
    )
    return lease


def overdue(job: str = "write_slot") -> Lease:
    """Lease still valid for 90 s, but the last heartbeat was 5 of its 6.5 minutes ago."""
    lease = held(job)
    SyncLock.objects.filter(job_name=job).update(
        locked_until=now_plus(timedelta(seconds=90)), heartbeat_at=now_plus(-timedelta(minutes=5))
    )
    return lease


def free(job: str = "write_slot") -> Lease:
    lease = held(job)
    assert release(lease=lease, status=Outcome.SUCCEEDED)
    return lease


def results(response) -> str:
    """The change list's result table only (not the filters or the summary)."""
    html = response.content.decode()
    match = re.search(r'<table id="result_list">.*?</table>', html, re.S)
    assert match, "no result table on the page"
    return match.group(0)


def row(response, job: str) -> str:
    for tr in re.findall(r"<tr>.*?</tr>", results(response), re.S):
        if f">{job}</a>" in tr:
            return re.sub(r"\s+", " ", tr)
    raise AssertionError(f"no row for {job}")


def text(response) -> str:
    return re.sub(r"\s+", " ", response.content.decode())


def plain(html: str) -> str:
    """What a reader sees: tags stripped, whitespace folded."""
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", "", html))


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    # admin_client's superuser is hashed with 1M PBKDF2 rounds otherwise (~1 s a test).
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def viewer(django_user_model):
    """Staff who may look at locks and runs but not release them."""
    user = django_user_model.objects.create_user("viewer", password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(
            content_type__app_label="locks", codename__in=["view_synclock", "view_jobrun"]
        )
    )
    return user


@pytest.fixture
def viewer_client(client, viewer):
    client.force_login(viewer)
    return client


@pytest.fixture
def releaser_client(client, viewer):
    """Staff with view permissions plus only the custom force-release one."""
    viewer.user_permissions.add(Permission.objects.get(codename="force_release_synclock"))
    client.force_login(viewer)
    return client


def detail_url(job: str = "write_slot") -> str:
    return reverse("admin:locks_synclock_change", args=[SyncLock.objects.get(job_name=job).pk])


def release_url(job: str = "write_slot") -> str:
    return reverse("admin:locks_synclock_force_release", args=[SyncLock.objects.get(job_name=job).pk])


# --- permissions ---------------------------------------------------------------


def test_anonymous_is_sent_to_the_login_page(client):
    held()
    run = JobRun.objects.create(job_name="write_slot", holder=HOLDER, token=1, started_at=timezone.now())
    urls = [
        LIST_URL,
        detail_url(),
        release_url(),
        RUNS_URL,
        reverse("admin:locks_jobrun_change", args=[run.pk]),
    ]
    for url in urls:
        response = client.get(url)
        assert response.status_code == 302, url
        assert response["Location"].startswith(reverse("admin:login")), url
    response = client.post(release_url())
    assert response.status_code == 302
    assert SyncLock.objects.get().locked_until is not None


def test_view_only_staff_sees_the_lock_but_cannot_release_it(viewer_client):
    lease = held()
    response = viewer_client.get(LIST_URL)
    assert response.status_code == 200
    assert HOLDER in row(response, "write_slot")
    assert 'value="force_release"' not in response.content.decode()
    assert 'name="_selected_action"' not in response.content.decode()

    response = viewer_client.get(detail_url())
    assert response.status_code == 200
    assert HOLDER in response.content.decode()
    assert 'id="force-release"' not in response.content.decode()

    assert viewer_client.get(release_url()).status_code == 403
    assert viewer_client.post(release_url()).status_code == 403
    # Posting the action by hand does nothing: it is not offered to this user.
    viewer_client.post(
        LIST_URL,
        {"action": "force_release", "_selected_action": [SyncLock.objects.get().pk], "post": "yes"},
    )
    lock = SyncLock.objects.get()
    assert (lock.token, lock.holder) == (lease.token, HOLDER)
    assert lock.locked_until is not None
    assert not LogEntry.objects.exists()


def test_superuser_is_offered_the_action_and_the_button(admin_client):
    held()
    response = admin_client.get(LIST_URL)
    assert 'value="force_release"' in response.content.decode()
    response = admin_client.get(detail_url())
    assert f'href="{release_url()}"' in response.content.decode()


def test_the_custom_permission_alone_grants_force_release(releaser_client):
    lease = held()
    assert 'value="force_release"' in releaser_client.get(LIST_URL).content.decode()
    assert 'id="force-release"' in releaser_client.get(detail_url()).content.decode()
    response = releaser_client.post(release_url())
    assert response.status_code == 302
    assert SyncLock.objects.get().token == lease.token + 1


def test_no_button_for_a_lock_nobody_holds(admin_client):
    free()
    assert 'id="force-release"' not in admin_client.get(detail_url()).content.decode()


def test_no_button_for_an_expired_lock_and_releasing_it_changes_nothing(admin_client):
    lease = expired()  # already free for the next run
    assert 'id="force-release"' not in admin_client.get(detail_url()).content.decode()

    response = admin_client.post(release_url(), follow=True)

    assert "is not held any more (its lease expired at " in text(response)
    lock = SyncLock.objects.get()
    assert (lock.token, lock.last_status, lock.holder) == (lease.token, Outcome.RUNNING, HOLDER)
    assert not LogEntry.objects.exists()


# --- state and relative time, from the database clock ---------------------------------


@pytest.mark.parametrize(
    ("make", "state", "lease_text"),
    [
        (free, "free", "released"),
        (held, "held", "in 4 minutes"),
        (expired, "expired, not released", "expired 3 minutes ago"),
        (overdue, "heartbeat overdue", "in 1 minute"),
    ],
    ids=["free", "held", "expired", "overdue"],
)
def test_state_and_relative_time_are_rendered(admin_client, make, state, lease_text):
    make()
    tr = row(admin_client.get(LIST_URL), "write_slot")
    assert re.search(rf'class="lock-badge"[^>]*>{re.escape(state)}</span>', tr), tr
    assert lease_text in tr
    # A released lease keeps no holder; every other state names it.
    holder = "—" if state == "free" else f'<span class="nowrap">{HOLDER}</span>'
    assert f'<td class="field-holder_token">{holder}<br><small class="nowrap">token <span' in tr
    detail = text(admin_client.get(detail_url()))
    assert f">{state}</span>" in detail
    assert lease_text in detail


def test_relative_times_follow_the_database_clock_not_the_hosts(admin_client, monkeypatch):
    held()
    # A web host whose clock is an hour fast must still see the lease as held.
    fast = timezone.now() + timedelta(hours=1)
    monkeypatch.setattr(timezone, "now", lambda: fast)
    tr = row(admin_client.get(LIST_URL), "write_slot")
    assert ">held</span>" in tr
    assert "in 4 minutes" in tr


def test_list_shows_token_tick_last_run_and_duration(admin_client):
    tick = timezone.now().replace(minute=0, second=0, microsecond=0)
    lease = acquire(job="write_slot", tick=tick, ttl=timedelta(minutes=5), holder=HOLDER)
    release(lease=lease, status=Outcome.FAILED, error="boom")
    SyncLock.objects.update(
        last_started_at=now_plus(-timedelta(minutes=10, seconds=30)),
        last_finished_at=now_plus(-timedelta(minutes=10)),
    )
    tr = row(admin_client.get(LIST_URL), "write_slot")
    assert f'token <span class="token">{lease.token}</span>' in tr
    # In the site's zone, one format for every time on the page, the UTC instant as the tooltip.
    shown = timezone.localtime(tick)  # TIME_ZONE: this host project's is Django's default, Chicago
    assert f'<span class="nowrap" title="{tick.isoformat()}">{shown:%Y-%m-%d %H:%M:%S %Z}</span>' in tr
    assert ">failed</span>" in tr
    assert "10 minutes ago · 30.0 s</small>" in tr  # the last run in one cell: when it ended, how long


def test_running_job_shows_how_long_it_has_been_running(admin_client):
    held()
    SyncLock.objects.update(last_started_at=now_plus(-timedelta(minutes=2, seconds=10)))
    tr = row(admin_client.get(LIST_URL), "write_slot")
    assert ">running</span>" in tr
    assert "running for 2 minutes" in tr
    expired("dead")  # its holder vanished mid-run
    assert "did not finish" in row(admin_client.get(LIST_URL), "dead")


# --- the summary line ---------------------------------------------------------------


def test_summary_names_last_success_next_tick_and_stuck_locks(admin_client, settings):
    reschedule(settings, "write_slot", "0 * * * *")
    free("write_slot")
    JobRun.objects.create(
        job_name="write_slot",
        holder=HOLDER,
        token=1,
        status=Outcome.SUCCEEDED,
        started_at=now_plus(-timedelta(minutes=13)),
        finished_at=now_plus(-timedelta(minutes=12, seconds=30)),
    )
    JobRun.objects.create(  # a later failure is not the last success
        job_name="write_slot",
        holder=HOLDER,
        token=2,
        status=Outcome.FAILED,
        started_at=now_plus(-timedelta(minutes=2)),
        finished_at=now_plus(-timedelta(minutes=1)),
    )
    expired("cleanup")
    overdue("report")
    held("mailer")

    response = admin_client.get(LIST_URL)
    summary = response.context["lock_summary"]
    assert summary.stuck == 2
    assert [job.job for job in summary.jobs] == [*HOST_JOBS, "check_jobs"]
    job = summary.jobs[0]
    assert timedelta(minutes=12) < summary.db_now - job.last_success < timedelta(minutes=13)
    assert job.next_tick.minute == 0
    assert timedelta(0) < job.next_tick - summary.db_now <= timedelta(hours=1)
    line = re.sub(r"\s+", " ", re.search(r'<p id="lock-summary".*?</p>', text(response)).group(0))
    assert "write_slot</strong>: last success 12 minutes ago" in line
    assert f"next tick {timezone.localtime(job.next_tick):%Y-%m-%d %H:%M}" in line
    assert re.search(r"\(in \d+ minutes?\)", line), line
    assert "2 stuck locks" in line

    stuck = admin_client.get(LIST_URL, {"state": "stuck"})
    assert {lock.job_name for lock in stuck.context["cl"].result_list} == {"cleanup", "report"}


def test_summary_without_history(admin_client, settings):
    reschedule(settings, "write_slot", "*/15 * * * *")
    line = text(admin_client.get(LIST_URL))
    assert "no successful run on record" in line
    assert "no stuck locks" in line


def test_summary_reports_a_bad_schedule_instead_of_failing(admin_client, settings):
    reschedule(settings, "write_slot", "every hour")
    free("write_slot")
    response = admin_client.get(LIST_URL)
    assert response.status_code == 200
    assert (
        "LOCKS_JOBS[&#x27;write_slot&#x27;]: schedule &#x27;every hour&#x27; is not a valid cron expression"
        in (text(response))
    )
    assert response.context["lock_summary"].jobs == []
    assert [lock.job_name for lock in response.context["cl"].result_list] == ["write_slot"]


def test_summary_lists_every_registered_job(admin_client, settings):
    reschedule(settings, "write_slot", "0 * * * *")
    response = admin_client.get(LIST_URL)
    summary = response.context["lock_summary"]
    assert [job.job for job in summary.jobs] == [*HOST_JOBS, "check_jobs"]
    record = summary.jobs[1]
    assert record.next_tick.minute % 5 == 0  # */5 * * * *
    assert timedelta(0) < record.next_tick - summary.db_now <= timedelta(minutes=5)
    line = re.sub(r"\s+", " ", re.search(r'<p id="lock-summary".*?</p>', text(response)).group(0))
    assert "<strong>record</strong>: no successful run on record" in line


@pytest.mark.parametrize(
    ("state", "jobs"),
    [("free", {"a"}), ("held", {"b"}), ("expired", {"c"}), ("heartbeat overdue", {"d"})],
)
def test_state_filter(admin_client, state, jobs):
    free("a"), held("b"), expired("c"), overdue("d")
    response = admin_client.get(LIST_URL, {"state": state})
    assert {lock.job_name for lock in response.context["cl"].result_list} == jobs


def test_pages_take_their_look_from_the_stylesheet_not_inline_styles(admin_client):
    held()
    expired("dead")
    sheet = finders.find("locks/admin.css")
    assert sheet, "locks/static/locks/admin.css is missing"
    css = Path(sheet).read_text()
    # Built on the admin's variables, so dark mode and themes apply.
    assert "var(--message-success-bg)" in css and "var(--error-fg)" in css
    assert not re.search(r"#[0-9a-fA-F]{3,6}\b\s*;", css)

    listing = admin_client.get(LIST_URL).content.decode()
    detail = admin_client.get(detail_url()).content.decode()
    confirm = admin_client.get(release_url()).content.decode()
    for page in (listing, detail, confirm):
        assert 'href="/static/locks/admin.css"' in page
    summary = re.search(r'<p id="lock-summary".*?</p>', listing, re.S).group(0)
    recent = re.search(r'<div class="module" id="recent-runs">.*?</div>', detail, re.S).group(0)
    for html in (results(admin_client.get(LIST_URL)), summary, recent, confirm):
        assert "style=" not in html
    assert '<p id="lock-summary" class="stuck">' in listing
    assert 'data-kind="expired"' in listing


# --- force release ----------------------------------------------------------------


def test_action_asks_for_confirmation_then_releases_and_logs(admin_client, admin_user):
    lease = held()
    held("other")
    pk = SyncLock.objects.get(job_name="write_slot").pk
    data = {"action": "force_release", "_selected_action": [pk]}

    confirm = admin_client.post(LIST_URL, data)
    assert confirm.status_code == 200
    assert "Force-release job locks?" in text(confirm)
    assert HOLDER in text(confirm)
    assert SyncLock.objects.get(job_name="write_slot").token == lease.token  # nothing yet

    done = admin_client.post(LIST_URL, {**data, "post": "yes"}, follow=True)
    lock = SyncLock.objects.get(job_name="write_slot")
    assert lock.locked_until is None
    assert lock.token == lease.token + 1
    assert lock.last_status == Outcome.RELEASED
    assert SyncLock.objects.get(job_name="other").locked_until is not None  # not selected
    assert (
        f"Released write_slot: holder was {HOLDER} (token {lease.token}); new token {lease.token + 1}."
        in text(done)
    )
    assert ">free</span>" in row(done, "write_slot")

    (entry,) = LogEntry.objects.all()
    assert (entry.user_id, entry.action_flag, entry.object_id) == (admin_user.pk, CHANGE, str(lock.pk))
    assert HOLDER in entry.get_change_message()
    assert f"token {lease.token}" in entry.get_change_message()


def test_button_releases_and_fences_out_the_old_holder(admin_client):
    lease = held()
    confirm = admin_client.get(release_url())
    assert confirm.status_code == 200
    assert HOLDER in text(confirm)
    assert SyncLock.objects.get().locked_until is not None

    response = admin_client.post(release_url())
    assert response.status_code == 302
    assert response["Location"] == LIST_URL
    lock = SyncLock.objects.get()
    assert lock.locked_until is None
    assert lock.token == lease.token + 1
    assert "admin:admin" in lock.last_error
    with pytest.raises(LockLost):
        renew(lease=lease)
    assert release(lease=lease, status=Outcome.SUCCEEDED) is False
    assert SyncLock.objects.get().last_status == Outcome.RELEASED
    assert LogEntry.objects.get().object_repr == "write_slot"


def test_releasing_a_free_lock_changes_nothing_and_says_so(admin_client):
    lease = free()
    response = admin_client.post(release_url(), follow=True)
    assert "Nothing to release: write_slot was not held." in text(response)
    assert SyncLock.objects.get().token == lease.token
    assert not LogEntry.objects.exists()


def shown(response) -> dict[str, str]:
    """The hidden inputs of a confirmation page that say what it showed (the fencing token; for a
    reset, the claimed tick and whether it was done)."""
    return dict(
        re.findall(r'<input type="hidden" name="(shown-[\w-]+)" value="([^"]*)">', response.content.decode())
    )


def test_the_confirmation_carries_the_token_it_showed(admin_client):
    lease = held()
    confirm = admin_client.get(release_url())
    pk = SyncLock.objects.get().pk
    assert shown(confirm) == {
        f"shown-{pk}": str(lease.token),
        f"shown-tick-{pk}": "",
        f"shown-done-{pk}": "0",
    }


def test_a_holder_that_finished_before_the_confirmation_keeps_its_outcome(admin_client):
    lease = held()
    tokens = shown(admin_client.get(release_url()))
    assert release(lease=lease, status=Outcome.SUCCEEDED)  # it finished meanwhile

    response = admin_client.post(release_url(), tokens, follow=True)

    lock = SyncLock.objects.get()
    assert (lock.token, lock.last_status, lock.last_error) == (lease.token, Outcome.SUCCEEDED, "")
    assert (
        f"Nothing released: lease on write_slot (token {lease.token}) is not held any more "
        "(finished as succeeded); nothing released." in text(response)
    )
    assert not LogEntry.objects.exists()


def test_a_holder_that_took_over_after_the_confirmation_is_not_released(admin_client):
    lease = held()
    data = {"action": "force_release", "_selected_action": [SyncLock.objects.get().pk]}
    tokens = shown(admin_client.post(LIST_URL, data))
    force_release(job="write_slot", by="another operator")
    newer = acquire(job="write_slot", tick=None, ttl=timedelta(minutes=5), holder="web-2:7:healthy")

    response = admin_client.post(LIST_URL, {**data, **tokens, "post": "yes"}, follow=True)

    lock = SyncLock.objects.get()
    assert (lock.token, lock.holder, lock.last_status) == (newer.token, "web-2:7:healthy", Outcome.RUNNING)
    assert lock.token == lease.token + 2
    assert (
        f"Nothing released: lease on write_slot is now token {newer.token} held by web-2:7:healthy; "
        "nothing released." in text(response)
    )
    renew(lease=newer)  # still its lease


def test_reset_tick_action_confirms_then_clears_the_tick_and_logs(admin_client, admin_user):
    tick = timezone.now().replace(year=2062, minute=0, second=0, microsecond=0)
    release(lease=acquire(job="write_slot", tick=tick, ttl=timedelta(minutes=5)), status="succeeded")
    free("other")
    pks = list(SyncLock.objects.values_list("pk", flat=True))
    data = {"action": "reset_tick", "_selected_action": pks}

    confirm = admin_client.post(LIST_URL, data)
    assert confirm.status_code == 200
    assert "Reset the claimed tick of job locks?" in text(confirm)
    assert 'id="confirm-reset-tick"' in text(confirm)
    assert f"{timezone.localtime(tick):%Y-%m-%d %H:%M:%S %Z}" in text(confirm)
    assert SyncLock.objects.get(job_name="write_slot").tick == tick  # nothing yet
    pk = SyncLock.objects.get(job_name="write_slot").pk
    assert {key: value for key, value in shown(confirm).items() if key.endswith(f"-{pk}")} == {
        f"shown-{pk}": "1",
        f"shown-tick-{pk}": tick.isoformat(),
        f"shown-done-{pk}": "1",
    }

    done = admin_client.post(LIST_URL, {**data, **shown(confirm), "post": "yes"}, follow=True)

    lock = SyncLock.objects.get(job_name="write_slot")
    assert (lock.tick, lock.tick_done, lock.token) == (None, False, 1)
    assert "Reset the claimed tick of 1 job lock: its next scheduled run may claim any tick." in text(done)
    assert "1 job lock had no claimed tick; nothing to reset." in text(done)
    (entry,) = LogEntry.objects.all()
    assert (entry.user_id, entry.action_flag, entry.object_id) == (admin_user.pk, CHANGE, str(lock.pk))
    assert entry.get_change_message() == f"Reset the claimed tick; it was {tick.isoformat()} (done)."


def test_a_reset_from_a_page_that_showed_an_older_tick_resets_nothing(admin_client):
    """Issue 17, reproduction 9: the admin's "reset the claimed tick" from a page that showed an
    older tick reset the tick done since, and that tick ran again."""
    older, newer = TICK, TICK + timedelta(minutes=5)
    release(lease=acquire(job="write_slot", tick=older, ttl=timedelta(minutes=5)), status="failed")
    data = {"action": "reset_tick", "_selected_action": [SyncLock.objects.get().pk]}
    page = shown(admin_client.post(LIST_URL, data))
    release(lease=acquire(job="write_slot", tick=newer, ttl=timedelta(minutes=5)), status="succeeded")

    response = admin_client.post(LIST_URL, {**data, **page, "post": "yes"}, follow=True)

    lock = SyncLock.objects.get()
    assert (lock.tick, lock.tick_done) == (newer, True)
    assert (
        f"Nothing reset: the claimed tick of write_slot is now {newer.isoformat()} (done), "
        f"not the {older.isoformat()} shown; nothing reset." in text(response)
    )
    assert not LogEntry.objects.exists()


def test_a_reset_of_a_tick_done_since_the_page_or_without_what_it_showed_resets_nothing(admin_client):
    lease = acquire(job="write_slot", tick=TICK, ttl=timedelta(minutes=5))
    data = {"action": "reset_tick", "_selected_action": [SyncLock.objects.get().pk]}
    page = shown(admin_client.post(LIST_URL, data))  # tick not done: its run is still going
    release(lease=lease, status="succeeded")

    done_since = admin_client.post(LIST_URL, {**data, **page, "post": "yes"}, follow=True)
    blind = admin_client.post(LIST_URL, {**data, "post": "yes"}, follow=True)

    assert SyncLock.objects.get().tick == TICK
    assert (
        f"Nothing reset: the claimed tick {TICK.isoformat()} of write_slot is done now, unlike what was shown; "
        "nothing reset." in text(done_since)
    )
    assert "Nothing reset for write_slot: the request did not say which tick was shown." in text(blind)


def test_a_reset_of_a_done_tick_at_or_before_now_resets_nothing_and_says_why(admin_client):
    """Issue 35, item 14: the page showed "done", and the reset let that slot run again."""
    release(lease=acquire(job="write_slot", tick=TICK, ttl=timedelta(minutes=5)), status="succeeded")
    data = {"action": "reset_tick", "_selected_action": [SyncLock.objects.get().pk]}
    page = shown(admin_client.post(LIST_URL, data))

    response = admin_client.post(LIST_URL, {**data, **page, "post": "yes"}, follow=True)

    assert (SyncLock.objects.get().tick, SyncLock.objects.get().tick_done) == (TICK, True)
    assert (
        f"Nothing reset: the claimed tick {TICK.isoformat()} of write_slot is done: a reset would let that "
        "slot run twice; nothing reset." in text(response)
    )
    assert not LogEntry.objects.exists()
    assert isinstance(acquire(job="write_slot", tick=TICK, ttl=timedelta(minutes=5)), Skip)


def test_reset_tick_needs_the_force_release_permission(viewer_client, viewer):
    lease = acquire(job="write_slot", tick=timezone.now(), ttl=timedelta(minutes=5))
    release(lease=lease, status="failed")
    lock = SyncLock.objects.get()
    data = {
        "action": "reset_tick",
        "_selected_action": [lock.pk],
        "post": "yes",
        f"shown-tick-{lock.pk}": lock.tick.isoformat(),
        f"shown-done-{lock.pk}": "0",
    }

    assert 'value="reset_tick"' not in viewer_client.get(LIST_URL).content.decode()
    viewer_client.post(LIST_URL, data)
    assert SyncLock.objects.get().tick is not None

    viewer.user_permissions.add(Permission.objects.get(codename="force_release_synclock"))
    assert 'value="reset_tick"' in viewer_client.get(LIST_URL).content.decode()
    viewer_client.post(LIST_URL, data)
    assert SyncLock.objects.get().tick is None


@pytest.mark.parametrize(
    ("status", "progress"),
    [("succeeded", "done"), ("failed", "not done: a later run may retry it"), (None, "not done yet")],
)
def test_the_tick_column_says_whether_the_tick_is_done(admin_client, status, progress):
    lease = acquire(job="write_slot", tick=timezone.now(), ttl=timedelta(minutes=5), holder=HOLDER)
    if status:
        release(lease=lease, status=status)
    tr = row(admin_client.get(LIST_URL), "write_slot")
    assert '<td class="field-tick_at"><span class="nowrap" title="' in tr
    assert f'<small class="nowrap">{progress}</small>' in tr


def test_release_url_of_an_unknown_lock_redirects_with_a_message(admin_client):
    response = admin_client.get(reverse("admin:locks_synclock_force_release", args=[987654]), follow=True)
    assert response.status_code == 200
    assert "987654" in text(response)
    assert "Perhaps it was deleted?" in text(response)


# --- read-only rows ---------------------------------------------------------------


def test_lease_fields_cannot_be_changed_added_or_deleted(admin_client):
    lease = held()
    pk = SyncLock.objects.get().pk
    response = admin_client.post(
        detail_url(), {"job_name": "write_slot", "holder": "intruder", "token": 99, "locked_until": ""}
    )
    assert response.status_code == 403
    assert admin_client.get(reverse("admin:locks_synclock_add")).status_code == 403
    assert admin_client.post(reverse("admin:locks_synclock_delete", args=[pk])).status_code == 403
    lock = SyncLock.objects.get()
    assert (lock.holder, lock.token) == (HOLDER, lease.token)
    assert lock.locked_until is not None
    # The form is a read-only view: no inputs for lease fields, no save button.
    page = admin_client.get(detail_url()).content.decode()
    assert 'name="holder"' not in page
    assert 'name="_save"' not in page


def test_runs_are_read_only(admin_client):
    run = JobRun.objects.create(job_name="write_slot", holder=HOLDER, token=3, started_at=timezone.now())
    url = reverse("admin:locks_jobrun_change", args=[run.pk])
    assert admin_client.post(url, {"status": "succeeded", "holder": "x"}).status_code == 403
    assert admin_client.get(reverse("admin:locks_jobrun_add")).status_code == 403
    assert admin_client.post(reverse("admin:locks_jobrun_delete", args=[run.pk])).status_code == 403
    run.refresh_from_db()
    assert (run.status, run.holder) == (Outcome.RUNNING, HOLDER)


# --- detail page and run history --------------------------------------------------------


def test_detail_page_shows_the_last_20_runs_of_that_job(admin_client):
    held()
    now = timezone.now()
    JobRun.objects.bulk_create(
        [
            JobRun(
                job_name="write_slot",
                holder=HOLDER,
                token=n,
                status=Outcome.SUCCEEDED,
                started_at=now - timedelta(hours=25 - n),
                finished_at=now - timedelta(hours=25 - n) + timedelta(seconds=3),
                stats={"fetched": 1758, "created": n},
            )
            for n in range(1, 26)
        ]
        + [JobRun(job_name="other", holder="x:1:a", token=1, started_at=now)]
    )
    response = admin_client.get(detail_url())
    runs = [item["run"] for item in response.context["recent_runs"]]
    assert [run.token for run in runs] == list(range(25, 5, -1))
    assert {run.job_name for run in runs} == {"write_slot"}
    page = text(response)
    assert "Last 20 runs" in page
    assert "created 25 · fetched 1758" in plain(page)  # by name: one order on every backend
    assert f'href="{RUNS_URL}?job_name=write_slot"' in page


def test_run_history_columns(admin_client):
    JobRun.objects.create(
        job_name="write_slot",
        tick=timezone.now().replace(minute=0, second=0, microsecond=0),
        holder=HOLDER,
        token=7,
        status=Outcome.FAILED,
        started_at=timezone.now() - timedelta(seconds=2, milliseconds=500),
        finished_at=timezone.now(),
        stats={"fetched": 1758, "created": 3, "updated": 0},
        error="CodeforcesError: " + "the API answered FAILED: Call limit exceeded " * 5,
    )
    response = admin_client.get(RUNS_URL)
    table = re.sub(r"\s+", " ", results(response))
    assert ">failed</span>" in table
    assert HOLDER in table
    assert re.search(r"2\.\d s", table)
    assert re.search(
        r'class="field-key_counts">[^<]*<span[^>]*>created 3</span> · <span[^>]*>fetched 1758</span></td>',
        table,
    )
    assert "updated 0" not in table  # zero counts are left out of the list
    assert "CodeforcesError: the API answered FAILED" in table
    assert "…</span>" in table  # excerpt, full text in the title


def test_run_history_filters_and_date_hierarchy(admin_client):
    now = timezone.now()
    JobRun.objects.bulk_create(
        [
            JobRun(job_name="a", holder="h", token=1, status=Outcome.SUCCEEDED, started_at=now),
            JobRun(job_name="a", holder="h", token=2, status=Outcome.FAILED, started_at=now),
            JobRun(job_name="b", holder="h", token=1, status=Outcome.FAILED, started_at=now),
            JobRun(
                job_name="b",
                holder="h",
                token=2,
                status=Outcome.LOST_LOCK,
                started_at=now - timedelta(days=400),
            ),
        ]
    )

    def tokens(**query):
        response = admin_client.get(RUNS_URL, query)
        assert response.status_code == 200
        return sorted((run.job_name, run.token) for run in response.context["cl"].result_list)

    assert tokens(job_name="a") == [("a", 1), ("a", 2)]
    assert tokens(status="failed") == [("a", 2), ("b", 1)]
    assert tokens(job_name="b", status="failed") == [("b", 1)]
    assert tokens(started_at__year=str(timezone.localtime(now).year)) == [("a", 1), ("a", 2), ("b", 1)]
    since = timezone.localtime(now - timedelta(days=1)).date()
    assert len(tokens(started_at__gte=str(since))) == 3  # the date filter's parameters
    page = admin_client.get(RUNS_URL).content.decode()
    # date_hierarchy: one link per year (its markup differs between Django 5.2 and 6.1)
    for moment in (now, now - timedelta(days=400)):
        assert f"?started_at__year={timezone.localtime(moment).year}" in page


# --- bounded queries -------------------------------------------------------------------


def test_locks_list_runs_a_bounded_number_of_queries(admin_client, django_assert_max_num_queries, settings):
    reschedule(settings, "write_slot", "0 * * * *")
    now = timezone.now()
    SyncLock.objects.bulk_create(
        [
            SyncLock(
                job_name=f"job-{n:04}",
                holder=f"host-{n % 7}:{n}:abcdef",
                token=n,
                acquired_at=now,
                locked_until=now + timedelta(minutes=n % 3 - 1) if n % 4 else None,
                heartbeat_at=now - timedelta(minutes=n % 5),
                tick=now,
                last_started_at=now - timedelta(seconds=30),
                last_finished_at=now,
                last_status=Outcome.SUCCEEDED,
            )
            for n in range(1000)
        ]
    )
    JobRun.objects.create(
        job_name="write_slot",
        holder=HOLDER,
        token=1,
        status=Outcome.SUCCEEDED,
        started_at=now,
        finished_at=now,
    )
    with django_assert_max_num_queries(8):
        response = admin_client.get(LIST_URL)
    assert len(response.context["cl"].result_list) == 100
    with django_assert_max_num_queries(8):
        assert admin_client.get(LIST_URL, {"state": "stuck"}).status_code == 200


def test_runs_list_runs_a_bounded_number_of_queries(admin_client, django_assert_max_num_queries):
    now = timezone.now()
    JobRun.objects.bulk_create(
        [
            JobRun(
                job_name=f"job-{n % 5}",
                holder=f"host:{n}:abcdef",
                token=n,
                started_at=now - timedelta(minutes=n),
                finished_at=now - timedelta(minutes=n) + timedelta(seconds=4),
                status=Outcome.SUCCEEDED if n % 3 else Outcome.FAILED,
                stats={"fetched": 1758, "created": n % 4},
                error="" if n % 3 else "boom " * 40,
            )
            for n in range(1000)
        ]
    )
    with django_assert_max_num_queries(9):  # a query for each filter's choices: job, status, requested by
        response = admin_client.get(RUNS_URL)
    assert len(response.context["cl"].result_list) == 100
    detail = reverse("admin:locks_jobrun_change", args=[JobRun.objects.first().pk])
    assert admin_client.get(detail).status_code == 200


# --- run retention --------------------------------------------------------------------


def _runs_started(job: str, *ages: timedelta) -> None:
    JobRun.objects.bulk_create(
        JobRun(job_name=job, holder=HOLDER, token=n, status=Outcome.SUCCEEDED, started_at=now_plus(-age))
        for n, age in enumerate(ages, start=1)
    )


def test_prune_runs_deletes_old_runs_of_that_job_in_one_statement(settings):
    """Then its old tick rows: its latest tick read, the older ones deleted (issue 36, item 6); first the
    names of the jobs removed from LOCKS_JOBS, read from the lock rows (a short table)."""
    settings.LOCKS_RUN_RETENTION_DAYS = 30
    _runs_started("write_slot", timedelta(days=45), timedelta(days=31), timedelta(days=29), timedelta(0))
    _runs_started("record", timedelta(days=90))
    with CaptureQueriesContext(connection) as queries:
        deleted = prune_runs(job="write_slot")
    assert deleted == 2
    verbs = [query["sql"].split(None, 1)[0].upper() for query in queries]
    # The removed jobs' names (their lock rows), the runs, this job's latest tick, the tick rows.
    assert verbs == ["SELECT", "DELETE", "SELECT", "DELETE"], [query["sql"] for query in queries]
    assert '"locks_synclock"' in queries[0]["sql"] and '"locks_jobrun"' in queries[1]["sql"]
    assert '"locks_tick"' in queries[3]["sql"]
    assert sorted(JobRun.objects.filter(job_name="write_slot").values_list("token", flat=True)) == [3, 4]
    assert JobRun.objects.filter(job_name="record").count() == 1  # another registered job's is its own


def test_retention_follows_the_setting(settings):
    settings.LOCKS_RUN_RETENTION_DAYS = 7
    _runs_started("write_slot", timedelta(days=8), timedelta(days=6))
    assert prune_runs(job="write_slot") == 1
    assert list(JobRun.objects.values_list("token", flat=True)) == [2]


def test_a_run_that_prunes_deletes_expired_history(settings):
    """Each run of a job an hour or more apart prunes (test_statements.py: about hourly)."""
    reschedule(settings, "write_slot", "0 * * * *")
    settings.LOCKS_RUN_RETENTION_DAYS = 30
    _runs_started("write_slot", timedelta(days=31), timedelta(days=1))
    result = run_locked(job="write_slot", tick=None, ttl=timedelta(seconds=30), fn=lambda lease: {})
    assert result.outcome == "succeeded"
    assert JobRun.objects.count() == 2  # yesterday's run and this one
    assert not JobRun.objects.filter(started_at__lt=timezone.now() - timedelta(days=30)).exists()


def test_a_job_removed_from_locks_jobs_has_its_old_history_pruned_by_the_others_runs_its_lock_row_stays(
    settings,
):
    """No run of a job removed from LOCKS_JOBS prunes its runs and tick rows any more: a registered
    job's run does, those older than the retention (one statement each, as for its own); its lock row
    (last run, token) stays for `locks status` until an operator deletes it. They were kept for ever."""
    reschedule(settings, "write_slot", "0 * * * *")  # each of its runs prunes
    settings.LOCKS_RUN_RETENTION_DAYS = 30
    _runs_started("removed", timedelta(days=90), timedelta(days=31), timedelta(days=2))
    _runs_started("record", timedelta(days=45))  # a registered job's history: its own runs prune it
    old, older = (timezone.now() - timedelta(days=days) for days in (40, 41))
    Tick.objects.claim([("removed", older, TTL), ("record", older, TTL)], holder=HOLDER)
    Tick.objects.claim([("removed", old, TTL), ("record", old, TTL)], holder=HOLDER)
    SyncLock.objects.create(job_name="removed", token=3)

    with CaptureQueriesContext(connection) as queries:
        result = run_locked(job="write_slot", tick=None, ttl=TTL, fn=lambda lease: {})

    assert result.outcome == "succeeded"
    assert sorted(JobRun.objects.values_list("job_name", "token")) == [
        ("record", 1),
        ("removed", 3),
        ("write_slot", 1),
    ]
    assert sorted(Tick.objects.values_list("job_name", "tick")) == [("record", older), ("record", old)]
    assert SyncLock.objects.filter(job_name="removed", token=3).exists()
    deletes = [query["sql"] for query in queries if query["sql"].upper().startswith("DELETE")]
    assert len(deletes) == 2, deletes  # the runs', the tick rows': as before
