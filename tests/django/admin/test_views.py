"""The admin pages through Django's test client on real PostgreSQL: lists, filters, search,
escaping, permission gating, read-only detail pages and CSRF on action POSTs.
"""

from __future__ import annotations

import html
import re
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import reverse

from celery_outbox.clock import utcnow
from celery_outbox.store.records import DeadLetterStatus, MessageStatus
from django_outbox.models import DeadLetter, OutboxMessage
from tests.django.admin_app import APP_PATH, dispatch_row, make_letter

pytestmark = pytest.mark.django_db

LETTERS = reverse("admin:django_outbox_deadletter_changelist")
MESSAGES = reverse("admin:django_outbox_outboxmessage_changelist")
SCRIPT = "<script>alert('x')</script>"
ESCAPED_SCRIPT = "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;"


@pytest.fixture(autouse=True)
def _outbox_app(settings: Any) -> None:
    """Requeue through the test app (``tests.django.admin_app``)."""
    settings.DJANGO_OUTBOX_CELERY_APP = APP_PATH


def staff(name: str, *perms: str) -> User:
    """A staff user holding ``perms`` (codenames of ``django_outbox``)."""
    user: User = User.objects.create_user(name, password="pw", is_staff=True)
    user.user_permissions.set(
        Permission.objects.filter(content_type__app_label="django_outbox", codename__in=perms)
    )
    return user


def client_for(user: User, *, csrf: bool = False) -> Client:
    """A client logged in as ``user``."""
    client = Client(enforce_csrf_checks=csrf)
    client.force_login(user)
    return client


@pytest.fixture
def admin_client_(admin_user: User) -> Client:
    """A client logged in as a superuser."""
    return client_for(admin_user)


def action_choices(client: Client, url: str) -> set[str]:
    """The action names the changelist at ``url`` offers."""
    response = client.get(url)
    assert response.status_code == 200
    form = response.context["action_form"]  # None when the user has no action at all
    return set() if form is None else {name for name, _ in form.fields["action"].choices if name}


def listed_ids(client: Client, url: str, **query: str) -> set[int]:
    """Primary keys of the rows the changelist shows for ``query``."""
    response = client.get(url, query)
    assert response.status_code == 200
    return {obj.pk for obj in response.context["cl"].result_list}


def run_action(client: Client, url: str, action: str, ids: list[int], **extra: str) -> Any:
    """POST ``action`` on ``ids`` to a changelist, following the redirect."""
    data = {"action": action, "_selected_action": [str(i) for i in ids], "index": "0", **extra}
    return client.post(url, data, follow=True)


def shown_messages(response: Any) -> list[str]:
    """The texts of the messages on the page."""
    return [str(m) for m in response.context["messages"]]


# -- dead letters ----------------------------------------------------------------------------
def test_changelist_shows_the_columns(admin_client_: Client) -> None:
    make_letter(exception_message="first line\nsecond line", retries=4)
    response = admin_client_.get(LETTERS)
    content = response.content.decode()
    # Five columns fit 1280 x 800 (test_admin_pages_browser.py); the task id, retries and
    # first failure are on the letter's page, the task id also on hover over the name.
    for header in ("Task name", "Exception type", "Message", "Failed at", "Status"):
        assert header in content
    for header in ("Task id", "Retries", "First failed at"):
        assert f">{header}<" not in content
    assert ">first line</span>" in content  # the cell: the first line only
    assert 'title="first line\nsecond line"' in content  # the rest on hover


def test_filters_by_status_task_and_exception(admin_client_: Client) -> None:
    a = make_letter(task_name="shop.a", exception_type="builtins.KeyError")
    b = make_letter(task_name="shop.b")
    c = make_letter(task_name="shop.b", status=DeadLetterStatus.DISCARDED.value)
    assert listed_ids(admin_client_, LETTERS, status__exact="dead") == {a.pk, b.pk}
    assert listed_ids(admin_client_, LETTERS, task_name="shop.b") == {b.pk, c.pk}
    assert listed_ids(admin_client_, LETTERS, exception_type="builtins.KeyError") == {a.pk}


def test_filters_by_failure_date(admin_client_: Client) -> None:
    old = make_letter()
    new = make_letter(failed_at=old.failed_at.replace(year=2025))
    assert listed_ids(admin_client_, LETTERS, failed_at__year="2025") == {new.pk}
    since = {
        "failed_at__gte": "2025-01-01 00:00:00+00:00",
        "failed_at__lt": "2026-01-01 00:00:00+00:00",
    }
    assert listed_ids(admin_client_, LETTERS, **since) == {new.pk}


def test_filters_by_failure_time_window(admin_client_: Client) -> None:
    now = utcnow()
    ages = {"minutes": timedelta(minutes=20), "hours": timedelta(hours=5),
            "days": timedelta(days=3), "weeks": timedelta(days=30)}  # fmt: skip
    letters = {age: make_letter(failed_at=now - ago).pk for age, ago in ages.items()}
    requeued = make_letter(failed_at=now, status=DeadLetterStatus.REQUEUED.value).pk
    windows = {
        "1h": {letters["minutes"], requeued},  # every status
        "24h": {letters["minutes"], letters["hours"], requeued},
        "7d": {letters["minutes"], letters["hours"], letters["days"], requeued},
        "older": {letters["weeks"]},
    }
    for window, expected in windows.items():
        assert listed_ids(admin_client_, LETTERS, failed_at_within=window) == expected, window
    assert listed_ids(admin_client_, LETTERS, failed_at_within="1h", status__exact="dead") == {
        letters["minutes"]
    }
    page = admin_client_.get(LETTERS, {"failed_at_within": "24h"}).content.decode()
    assert "By failure time" in page
    assert 'class="selected"' in page.split("Last 24 hours")[0].rsplit("<li", 1)[1]


def test_search_by_task_id_and_message(admin_client_: Client) -> None:
    a = make_letter(task_id="order-1234", exception_message="card declined")
    b = make_letter(task_id="order-9999", exception_message="timeout talking to SMS gateway")
    assert listed_ids(admin_client_, LETTERS, q="order-1234") == {a.pk}
    assert listed_ids(admin_client_, LETTERS, q="SMS gateway") == {b.pk}


def test_detail_is_read_only_pretty_and_escaped(admin_client_: Client) -> None:
    letter = make_letter(
        args=[SCRIPT, {"n": 1}],
        kwargs={"note": SCRIPT},
        exception_message=SCRIPT,
        traceback=f"Traceback\n  {SCRIPT}\n",
    )
    url = reverse("admin:django_outbox_deadletter_change", args=[letter.pk])
    response = admin_client_.get(url)
    content = response.content.decode()
    assert response.status_code == 200
    assert SCRIPT not in content
    assert content.count(ESCAPED_SCRIPT) >= 4  # args, kwargs, message, traceback
    assert '<pre class="outbox-pre">[\n  &quot;&lt;script&gt;' in content
    assert 'name="_save"' not in content
    assert "<textarea" not in content


def test_a_letters_page_links_to_its_group(admin_client_: Client) -> None:
    letter = make_letter(task_name=SCRIPT, exception_type="shop.Declined")
    same = make_letter(task_name=SCRIPT, exception_type="shop.Declined")
    make_letter(task_name=SCRIPT, exception_type="shop.Declined", status="discarded")
    make_letter(task_name=SCRIPT, exception_type="shop.Timeout")
    make_letter(exception_type="shop.Declined")
    url = reverse("admin:django_outbox_deadletter_change", args=[letter.pk])
    page = admin_client_.get(url).content.decode()
    href = re.search(r'<a href="([^"]+)" class="outbox-group-link">', page)
    assert href is not None
    group = html.unescape(href.group(1))
    assert admin_client_.get(group).status_code == 200
    assert {o.pk for o in admin_client_.get(group).context["cl"].result_list} == {
        letter.pk,
        same.pk,
    }


def test_escaped_in_the_changelist_too(admin_client_: Client) -> None:
    make_letter(exception_message=SCRIPT, task_name=SCRIPT)
    content = admin_client_.get(LETTERS).content.decode()
    assert SCRIPT not in content
    assert ESCAPED_SCRIPT in content


def test_no_add_change_or_delete(admin_client_: Client) -> None:
    letter = make_letter()
    assert admin_client_.get(reverse("admin:django_outbox_deadletter_add")).status_code == 403
    delete = reverse("admin:django_outbox_deadletter_delete", args=[letter.pk])
    assert admin_client_.get(delete).status_code == 403
    change = reverse("admin:django_outbox_deadletter_change", args=[letter.pk])
    assert admin_client_.post(change, {"task_name": "x"}).status_code == 403
    assert "delete_selected" not in action_choices(admin_client_, LETTERS)


def test_superuser_has_both_actions(admin_client_: Client) -> None:
    assert action_choices(admin_client_, LETTERS) == {"requeue_selected", "discard_selected"}


@pytest.mark.parametrize(
    ("perms", "actions"),
    [
        (("view_deadletter",), set()),
        (("view_deadletter", "requeue_deadletter"), {"requeue_selected"}),
        (("view_deadletter", "discard_deadletter"), {"discard_selected"}),
    ],
)
def test_actions_follow_permissions(perms: tuple[str, ...], actions: set[str]) -> None:
    client = client_for(staff("bob", *perms))
    assert action_choices(client, LETTERS) == actions


def test_staff_without_view_permission_cannot_see_dead_letters() -> None:
    client = client_for(staff("eve", "requeue_deadletter"))
    assert client.get(LETTERS).status_code == 403


def test_requeue_action_reports_counts(admin_client_: Client) -> None:
    dead = [make_letter(), make_letter()]
    done = make_letter(status=DeadLetterStatus.DISCARDED.value)
    response = run_action(
        admin_client_, LETTERS, "requeue_selected", [dead[0].pk, dead[1].pk, done.pk]
    )
    assert shown_messages(response) == [
        "2 dead letters were requeued.",
        "1 selected letter was skipped: it is not dead (already requeued or discarded).",
    ]
    assert OutboxMessage.objects.count() == 2
    statuses = DeadLetter.objects.filter(pk__in=[d.pk for d in dead]).values_list(
        "status", "requeued_by"
    )
    assert set(statuses) == {(DeadLetterStatus.REQUEUED.value, "admin")}


def test_discard_action_reports_counts(admin_client_: Client) -> None:
    letter = make_letter()
    response = run_action(admin_client_, LETTERS, "discard_selected", [letter.pk])
    assert shown_messages(response) == ["1 dead letter was discarded."]
    letter.refresh_from_db()
    assert letter.status == DeadLetterStatus.DISCARDED.value


def test_posting_a_forbidden_action_does_nothing() -> None:
    letter = make_letter()
    client = client_for(staff("bob", "view_deadletter", "discard_deadletter"))
    response = run_action(client, LETTERS, "requeue_selected", [letter.pk])
    assert response.status_code == 200
    letter.refresh_from_db()
    assert letter.status == DeadLetterStatus.DEAD.value
    assert not OutboxMessage.objects.exists()


def test_action_post_without_csrf_token_is_refused(admin_user: User) -> None:
    letter = make_letter()
    client = client_for(admin_user, csrf=True)
    response = client.post(
        LETTERS, {"action": "requeue_selected", "_selected_action": [str(letter.pk)], "index": "0"}
    )
    assert response.status_code == 403
    letter.refresh_from_db()
    assert letter.status == DeadLetterStatus.DEAD.value


def test_action_post_with_csrf_token_works(admin_user: User) -> None:
    letter = make_letter()
    client = client_for(admin_user, csrf=True)
    token = client.get(LETTERS).context["csrf_token"]
    response = run_action(
        client, LETTERS, "requeue_selected", [letter.pk], csrfmiddlewaretoken=str(token)
    )
    assert shown_messages(response) == ["1 dead letter was requeued."]


# -- outbox messages -------------------------------------------------------------------------
def test_outbox_changelist_filters_and_search(admin_client_: Client) -> None:
    pending = dispatch_row()
    failed = dispatch_row()
    OutboxMessage.objects.filter(pk=failed.pk).update(status=MessageStatus.FAILED.value)
    assert listed_ids(admin_client_, MESSAGES) == {pending.pk, failed.pk}
    assert listed_ids(admin_client_, MESSAGES, status__exact="failed") == {failed.pk}
    assert listed_ids(admin_client_, MESSAGES, task_name=pending.task_name) == {
        pending.pk,
        failed.pk,
    }
    assert listed_ids(admin_client_, MESSAGES, q=pending.task_id) == {pending.pk}


def test_outbox_detail_is_read_only_and_escaped(admin_client_: Client) -> None:
    row = dispatch_row()
    OutboxMessage.objects.filter(pk=row.pk).update(last_error=SCRIPT)
    from tests.django.admin_app import app
    from tests.django.celery_app import RECORD

    result = app.tasks[RECORD].apply_async(kwargs={"user_id": None, "using": SCRIPT})
    scripted = OutboxMessage.objects.get(task_id=result.id)
    for pk in (row.pk, scripted.pk):
        url = reverse("admin:django_outbox_outboxmessage_change", args=[pk])
        content = admin_client_.get(url).content.decode()
        assert SCRIPT not in content
        assert 'name="_save"' not in content
    assert ESCAPED_SCRIPT in content
    assert "&quot;using&quot;: &quot;&lt;script&gt;" in content


def test_outbox_actions_need_the_change_or_cancel_permission(admin_client_: Client) -> None:
    everything = {"publish_now", "reset_failed", "cancel_selected"}
    assert action_choices(admin_client_, MESSAGES) == everything
    viewer = client_for(staff("bob", "view_outboxmessage"))
    assert action_choices(viewer, MESSAGES) == set()
    operator = client_for(staff("carol", "view_outboxmessage", "change_outboxmessage"))
    assert action_choices(operator, MESSAGES) == {"publish_now", "reset_failed"}
    canceller = client_for(staff("dave", "view_outboxmessage", "cancel_outboxmessage"))
    assert action_choices(canceller, MESSAGES) == {"cancel_selected"}


def test_reset_action(admin_client_: Client) -> None:
    failed = dispatch_row()
    OutboxMessage.objects.filter(pk=failed.pk).update(
        status=MessageStatus.FAILED.value, attempts=20
    )
    response = run_action(admin_client_, MESSAGES, "reset_failed", [failed.pk])
    assert shown_messages(response) == [
        "1 failed outbox message was reset; the sweeper will publish it."
    ]
    failed.refresh_from_db()
    assert (failed.status, failed.attempts) == (MessageStatus.PENDING.value, 0)


def test_publish_now_action(admin_client_: Client) -> None:
    later = dispatch_row(countdown=3600)
    response = run_action(admin_client_, MESSAGES, "publish_now", [later.pk])
    assert shown_messages(response) == ["1 outbox message is being published."]
    later.refresh_from_db()
    assert later.available_at <= utcnow()  # was an hour ahead
    assert later.status == MessageStatus.PENDING.value  # published after commit (none here)


def test_cancel_action_deletes_pending_rows_logs_them_and_skips_the_rest() -> None:
    from django.contrib.admin.models import DELETION, LogEntry

    pending, failed, taken = dispatch_row(), dispatch_row(), dispatch_row()
    OutboxMessage.objects.filter(pk=failed.pk).update(status=MessageStatus.FAILED.value)
    # Born leased to their on-commit publisher (never run in this test's transaction):
    # only ``taken`` stays so, in flight.
    OutboxMessage.objects.exclude(pk=taken.pk).update(locked_until=None)
    canceller = staff("erin", "view_outboxmessage", "cancel_outboxmessage")
    selected = [pending.pk, failed.pk, taken.pk]
    response = run_action(client_for(canceller), MESSAGES, "cancel_selected", selected)
    assert shown_messages(response) == [
        "2 outbox messages were cancelled: they will not be published.",
        # The test's transaction never commits: the revoke is still to be sent.
        "1 of them was being published; its task id is revoked when the transaction commits.",
        "1 selected message was skipped: it is not pending.",
    ]
    assert list(OutboxMessage.objects.values_list("pk", flat=True)) == [failed.pk]
    # object_id is text: order numerically, or ids 99 and 101 sort the wrong way.
    entries = sorted(LogEntry.objects.all(), key=lambda e: int(e.object_id))
    assert [(e.user, e.object_id, e.action_flag) for e in entries] == [
        (canceller, str(pending.pk), DELETION),
        (canceller, str(taken.pk), DELETION),
    ]


# -- sorting -----------------------------------------------------------------------------------
@pytest.mark.parametrize(
    ("model", "sortable"),
    [
        ("deadletter", set()),
        ("outboxmessage", set()),
        ("completedtask", {"task id", "completed at"}),
    ],
)
def test_only_columns_an_index_orders_sort(
    admin_client_: Client, model: str, sortable: set[str]
) -> None:
    # Any other column's order would sort the whole table for one page (docs/benchmarks §15).
    from django.contrib.admin.templatetags.admin_list import result_headers

    response = admin_client_.get(reverse(f"admin:django_outbox_{model}_changelist"))
    assert response.status_code == 200
    headers = list(result_headers(response.context["cl"]))
    assert {str(h["text"]) for h in headers if h["sortable"]} == sortable
