"""The contests and reminders admin through Django's test client."""

from __future__ import annotations

import json
import re
from datetime import UTC, datetime, timedelta

import pytest
from django.contrib.admin.models import LogEntry
from django.urls import reverse
from django.utils import timezone
from django.utils.html import escape
from django.utils.text import Truncator

from contests.models import Contest, Platform, Reminder
from tests.contests.reminder_data import make_contest
from tests.standin import FIXTURE

pytestmark = pytest.mark.django_db

CONTESTS_URL = reverse("admin:contests_contest_changelist")
REMINDERS_URL = reverse("admin:contests_reminder_changelist")


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def contest(contest_id: int, *, start: timedelta | None, **fields) -> Contest:
    """A contest starting ``start`` from now (negative: in the past, and finished)."""
    fields.setdefault("phase", "BEFORE" if start and start > timedelta(0) else "FINISHED")
    return make_contest(contest_id, start=start, **fields)


def real_contests(limit: int) -> list[Contest]:
    """The first ``limit`` contests of the bundled real contest.list response."""
    now = timezone.now()
    entries = json.loads(FIXTURE.read_text())["result"][:limit]
    return Contest.objects.bulk_create(
        Contest(
            platform=Platform.CODEFORCES,
            contest_id=entry["id"],
            name=entry["name"],
            type=entry["type"],
            phase=entry["phase"],
            frozen=entry["frozen"],
            start_time=datetime.fromtimestamp(entry["startTimeSeconds"], tz=UTC),
            duration=timedelta(seconds=entry["durationSeconds"]),
            fingerprint="0" * 32,
            updated_at=now,
        )
        for entry in entries
    )


def listed(client, url: str, **query) -> list:
    response = client.get(url, query)
    assert response.status_code == 200, response.content[:500]
    return list(response.context["cl"].result_list)


def results(response) -> str:
    match = re.search(r'<table id="result_list">.*?</table>', response.content.decode(), re.S)
    assert match, "no result table on the page"
    return re.sub(r"\s+", " ", match.group(0))


# --- contests -------------------------------------------------------------------


def test_anonymous_is_sent_to_the_login_page(client):
    for url in (CONTESTS_URL, REMINDERS_URL):
        response = client.get(url)
        assert response.status_code == 302
        assert response["Location"].startswith(reverse("admin:login"))


def test_contest_list_columns_and_codeforces_link(admin_client):
    contest(1843, start=timedelta(days=2), type="ICPC", duration=timedelta(hours=2, minutes=15))
    contest(1801, start=-timedelta(days=30), removed_at=timezone.now())
    table = results(admin_client.get(CONTESTS_URL))
    assert "Codeforces Round 1843 (Div. 2)" in table
    assert ">BEFORE<" in table
    assert ">ICPC<" in table
    assert "2 h 15 min" in table
    assert 'href="https://codeforces.com/contest/1843"' in table
    assert 'rel="noopener noreferrer"' in table
    assert table.count('alt="True"') == 1  # the removed one


def test_contest_filters(admin_client):
    contest(1, start=timedelta(days=1))  # upcoming
    contest(2, start=timedelta(days=3), removed_at=timezone.now())  # vanished from the API
    contest(3, start=-timedelta(days=1), type="IOI")
    contest(4, start=-timedelta(hours=1), phase="CODING", type="ICPC")

    def ids(**query):
        return sorted(c.contest_id for c in listed(admin_client, CONTESTS_URL, **query))

    assert ids(upcoming="yes") == [1]
    assert ids(upcoming="no") == [2, 3, 4]
    assert ids(removed_at__isempty="0") == [2]  # removed
    assert ids(removed_at__isempty="1") == [1, 3, 4]
    assert ids(phase="CODING") == [4]
    assert ids(phase="FINISHED") == [3]
    assert ids(type="IOI") == [3]
    assert ids(type="CF", upcoming="yes") == [1]


def test_contest_search_by_name_and_id(admin_client):
    contest(1843, start=None, name="Codeforces Round 884 (Div. 1 + Div. 2)")
    contest(11843, start=None, name="Educational Round 200")
    contest(884, start=None, name="Kotlin Heroes")

    def ids(term):
        return sorted(c.contest_id for c in listed(admin_client, CONTESTS_URL, q=term))

    assert ids("1843") == [1843]  # the id exactly, not 11843
    assert ids("884") == [884, 1843]  # id 884, and "884" in a name
    assert ids("educational") == [11843]
    assert ids("Round Div") == [1843]


def test_contest_date_hierarchy(admin_client):
    real_contests(50)
    years = {c.start_time.year for c in Contest.objects.all()}
    year = min(years)
    page = admin_client.get(CONTESTS_URL).content.decode()
    assert '<nav class="toplinks">' in page
    assert f"start_time__year={year}" in page
    assert {c.start_time.year for c in listed(admin_client, CONTESTS_URL, start_time__year=year)} == {year}


def test_contests_are_read_only(admin_client):
    row = contest(1843, start=timedelta(days=1))
    url = reverse("admin:contests_contest_change", args=[row.pk])
    page = admin_client.get(url)
    assert page.status_code == 200
    assert 'name="name"' not in page.content.decode()
    assert 'href="https://codeforces.com/contest/1843"' in page.content.decode()
    assert admin_client.post(url, {"name": "Renamed", "phase": "FINISHED"}).status_code == 403
    assert admin_client.get(reverse("admin:contests_contest_add")).status_code == 403
    assert admin_client.post(reverse("admin:contests_contest_delete", args=[row.pk])).status_code == 403
    row.refresh_from_db()
    assert (row.name, row.phase) == ("Codeforces Round 1843 (Div. 2)", "BEFORE")


def test_contest_list_runs_a_bounded_number_of_queries(admin_client, django_assert_max_num_queries):
    real_contests(1000)
    with django_assert_max_num_queries(9):
        response = admin_client.get(CONTESTS_URL)
    assert len(response.context["cl"].result_list) == 100
    assert response.context["cl"].result_count == 1000
    with django_assert_max_num_queries(9):
        assert admin_client.get(CONTESTS_URL, {"upcoming": "no", "q": "Round"}).status_code == 200


# --- reminders ------------------------------------------------------------------


@pytest.fixture
def alice(django_user_model):
    return django_user_model.objects.create_user("alice")


def test_reminder_states(admin_client, alice):
    soon = contest(1, start=timedelta(days=2))
    started = contest(2, start=-timedelta(minutes=10), phase="CODING")
    removed = contest(3, start=timedelta(days=5), removed_at=timezone.now())
    now = timezone.now()
    Reminder.objects.bulk_create(
        [
            Reminder(user=alice, contest=soon, remind_at=now + timedelta(days=1)),  # upcoming
            Reminder(user=alice, contest=soon, remind_at=now - timedelta(minutes=5)),  # due
            Reminder(user=alice, contest=started, remind_at=now - timedelta(hours=1)),  # stale
            Reminder(user=alice, contest=removed, remind_at=now + timedelta(days=4)),  # stale
        ]
    )
    response = admin_client.get(REMINDERS_URL)
    states = {(r.contest.contest_id, r.remind_at > now): r.state for r in response.context["cl"].result_list}
    assert states == {(1, True): "upcoming", (1, False): "due", (2, False): "stale", (3, True): "stale"}
    table = results(response)
    assert table.count(">upcoming</span>") == 1
    assert table.count(">due</span>") == 1
    assert table.count(">stale</span>") == 2
    # Stale is exactly what the sync prunes.
    assert {r.pk for r in Reminder.objects.stale()} == {
        r.pk for r in response.context["cl"].result_list if r.state == "stale"
    }

    def contest_ids(state):
        return sorted(r.contest.contest_id for r in listed(admin_client, REMINDERS_URL, state=state))

    assert contest_ids("upcoming") == [1]
    assert contest_ids("due") == [1]
    assert contest_ids("stale") == [2, 3]


def test_reminder_form_uses_autocomplete_for_user_and_contest(admin_client, alice):
    contest(1843, start=timedelta(days=2), name="Codeforces Round 999 (Div. 2)")
    contest(1700, start=-timedelta(days=200), name="Codeforces Round 800 (Div. 2)")
    page = admin_client.get(reverse("admin:contests_reminder_add")).content.decode()
    for field in ("user", "contest"):
        assert re.search(rf'<select name="{field}"[^>]*class="admin-autocomplete', page), field

    def autocomplete(field, term):
        response = admin_client.get(
            reverse("admin:autocomplete"),
            {"app_label": "contests", "model_name": "reminder", "field_name": field, "term": term},
        )
        assert response.status_code == 200
        return [item["text"] for item in response.json()["results"]]

    assert autocomplete("user", "ali") == ["alice"]
    # Only contests that have not started can still be picked for a reminder.
    assert autocomplete("contest", "Codeforces Round") == ["Codeforces Round 999 (Div. 2)"]
    assert autocomplete("contest", "1843") == ["Codeforces Round 999 (Div. 2)"]


def test_reminder_can_be_added_through_the_admin(admin_client, alice):
    target = contest(1843, start=timedelta(days=2))
    remind_at = timezone.localtime(target.start_time - timedelta(hours=1))
    response = admin_client.post(
        reverse("admin:contests_reminder_add"),
        {
            "user": alice.pk,
            "contest": target.pk,
            "remind_at_0": f"{remind_at:%Y-%m-%d}",
            "remind_at_1": f"{remind_at:%H:%M:%S}",
        },
    )
    assert response.status_code == 302, response.content.decode()[:2000]
    reminder = Reminder.objects.get()
    assert (reminder.user, reminder.contest) == (alice, target)


def test_reminder_list_runs_a_bounded_number_of_queries(
    admin_client, django_user_model, django_assert_max_num_queries
):
    users = django_user_model.objects.bulk_create(
        django_user_model(username=f"user{n}", password="!") for n in range(50)
    )
    contests = [contest(n, start=timedelta(days=n - 10)) for n in range(1, 21)]
    now = timezone.now()
    Reminder.objects.bulk_create(
        Reminder(user=user, contest=c, remind_at=now + timedelta(hours=n))
        for n, (user, c) in enumerate((user, c) for user in users for c in contests)
    )
    assert Reminder.objects.count() == 1000
    with django_assert_max_num_queries(7):
        response = admin_client.get(REMINDERS_URL)
    assert len(response.context["cl"].result_list) == 100
    with django_assert_max_num_queries(7):
        assert admin_client.get(REMINDERS_URL, {"state": "stale", "q": "user1"}).status_code == 200


def test_reminder_delivery_column_and_filter(admin_client, alice):
    soon = contest(1, start=timedelta(days=2))
    now = timezone.now()
    Reminder.objects.bulk_create(
        [
            Reminder(
                user=alice, contest=soon, remind_at=now - timedelta(minutes=9), delivered_at=now, attempts=1
            ),
            Reminder(
                user=alice,
                contest=soon,
                remind_at=now - timedelta(minutes=8),
                failed_at=now,
                attempts=5,
                last_error="attempt 5: SMTPRecipientsRefused: {'alice@example.com': (550, b'5.1.1 <alice@example.com>: no such user')}",
            ),
            Reminder(
                user=alice,
                contest=soon,
                remind_at=now - timedelta(minutes=7),
                attempts=1,
                last_error="attempt 1: SMTPRecipientsRefused: retry me",
            ),
            Reminder(
                user=alice,
                contest=soon,
                remind_at=now - timedelta(minutes=6),
                uncertain_at=now,
                attempts=2,
                last_error="attempt 2: outcome unknown, the message went out but the mail server's answer never came",
            ),
            Reminder(user=alice, contest=soon, remind_at=now + timedelta(hours=1)),
        ]
    )
    response = admin_client.get(REMINDERS_URL)
    found = {(r.attempts, r.delivery, r.state) for r in response.context["cl"].result_list}
    # Delivered, uncertain and failed ones have no upcoming/due state: their delivery says it all.
    assert found == {
        (1, "delivered", None),
        (5, "failed", None),
        (2, "uncertain", None),
        (1, "pending", "due"),
        (0, "pending", "upcoming"),
    }
    table = results(response)
    assert table.count(">delivered</span>") == 1
    assert table.count(">failed</span>") == 1
    assert table.count('data-kind="uncertain" title="">uncertain</span>') == 1
    assert table.count(">pending</span>") == 2
    assert "attempt 1: SMTPRecipientsRefused: retry me" in table
    long_error = Reminder.objects.get(attempts=5).last_error
    assert len(long_error) > 80
    assert escape(Truncator(long_error).chars(80)) in table
    assert escape(long_error) not in table
    assert "contests/admin.css" in response.content.decode()  # the uncertain badge's style

    def attempts(**query):
        return sorted(r.attempts for r in listed(admin_client, REMINDERS_URL, **query))

    assert attempts(delivery="delivered") == [1]
    assert attempts(delivery="failed") == [5]
    assert attempts(delivery="uncertain") == [2]
    assert attempts(delivery="pending") == [0, 1]
    # "due" is exactly what the next send_reminders run sends.
    assert attempts(state="due") == [1]
    assert {r.pk for r in Reminder.objects.due()} == {
        r.pk for r in listed(admin_client, REMINDERS_URL, state="due")
    }


def test_reminder_delivery_fields_are_read_only(admin_client, alice):
    target = contest(1843, start=timedelta(days=2))
    reminder = Reminder.objects.create(user=alice, contest=target, remind_at=timezone.now())
    page = admin_client.get(reverse("admin:contests_reminder_change", args=[reminder.pk])).content.decode()
    assert 'name="remind_at_0"' in page
    fields = (
        "delivered_at",
        "attempts",
        "last_error",
        "claimed_until",
        "claimed_by",
        "failed_at",
        "uncertain_at",
    )
    for field in fields:
        assert f'name="{field}"' not in page, field
        assert f"field-{field}" in page, field


def test_the_retry_action_asks_first_then_makes_failed_and_uncertain_reminders_pending(admin_client, alice):
    soon = contest(1, start=timedelta(days=2))
    now = timezone.now()
    failed = Reminder.objects.create(
        user=alice,
        contest=soon,
        remind_at=now - timedelta(minutes=3),
        failed_at=now,
        attempts=5,
        last_error="attempt 5: SMTPRecipientsRefused: no such user",
    )
    uncertain = Reminder.objects.create(
        user=alice,
        contest=soon,
        remind_at=now - timedelta(minutes=2),
        uncertain_at=now,
        attempts=1,
        last_error="attempt 1: outcome unknown, the message went out",
    )
    delivered = Reminder.objects.create(
        user=alice, contest=soon, remind_at=now - timedelta(minutes=1), delivered_at=now, attempts=1
    )
    chosen = {"action": "retry_delivery", "_selected_action": [failed.pk, uncertain.pk, delivered.pk]}

    asked = admin_client.post(REMINDERS_URL, chosen)

    assert asked.status_code == 200
    assert asked.templates[0].name == "admin/contests/reminder/retry_confirmation.html"
    page = re.sub(r"\s+", " ", asked.content.decode())
    assert "1 of them is uncertain: its email was handed to the mail server once" in page
    assert "Retrying sends it again: the user may get it twice." in page
    assert "1 selected reminder is pending or delivered: it is left as it is." in page
    assert 'value="Yes, send them again"' in page
    assert page.count("<td>uncertain</td>") == 1 and page.count("<td>failed</td>") == 1
    assert Reminder.objects.filter(failed_at__isnull=False).count() == 1  # nothing changed yet
    assert Reminder.objects.filter(uncertain_at__isnull=False).count() == 1

    response = admin_client.post(REMINDERS_URL, {**chosen, "post": "yes"}, follow=True)

    assert response.status_code == 200
    assert "2 reminders are pending again: the next run emails them." in [
        str(m) for m in response.context["messages"]
    ]
    for reminder in (failed, uncertain, delivered):
        reminder.refresh_from_db()
    assert (failed.failed_at, failed.attempts, failed.last_error) == (
        None,
        0,
        "attempt 5: SMTPRecipientsRefused: no such user",
    )
    assert (uncertain.uncertain_at, uncertain.attempts) == (None, 0)
    assert {r.pk for r in Reminder.objects.due()} == {failed.pk, uncertain.pk}
    assert delivered.delivered_at is not None  # a delivered one is never sent again
    logged = LogEntry.objects.filter(object_id__in=[str(failed.pk), str(uncertain.pk)])
    assert sorted(entry.get_change_message() for entry in logged) == [
        "Delivery retried; it was failed: attempt 5: SMTPRecipientsRefused: no such user",
        "Delivery retried; it was uncertain: attempt 1: outcome unknown, the message went out",
    ]


def test_the_retry_action_says_so_when_nothing_can_be_retried(admin_client, alice):
    pending = Reminder.objects.create(
        user=alice, contest=contest(1, start=timedelta(days=2)), remind_at=timezone.now()
    )

    asked = admin_client.post(REMINDERS_URL, {"action": "retry_delivery", "_selected_action": [pending.pk]})

    page = re.sub(r"\s+", " ", asked.content.decode())
    assert "None of the selected reminders failed or is uncertain: there is nothing to retry." in page
    assert 'id="confirm-retry"' not in page
