"""The admin's overview page through Django's test client on real PostgreSQL: the figures,
the groups and their actions (confirmation, permissions, CSRF), escaping, and the entry
in the "Celery outbox" section.
"""

from __future__ import annotations

from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.test import Client
from django.urls import reverse

from celery_outbox.clock import utcnow
from celery_outbox.config import OutboxConfig
from celery_outbox.state import state_of
from celery_outbox.store.records import DeadLetterStatus, MessageStatus
from django_outbox.models import DeadLetter, OutboxMessage, SweepRecord, Workflow
from tests.django.admin.test_views import client_for, shown_messages, staff
from tests.django.admin_app import APP_PATH, OTHER, dispatch_row, make_letter
from tests.django.celery_app import RECORD

pytestmark = pytest.mark.django_db

OVERVIEW = reverse("admin:django_outbox_overview_changelist")
REQUEUE = reverse("admin:django_outbox_overview_group", args=["requeue"])
DISCARD = reverse("admin:django_outbox_overview_group", args=["discard"])
SCRIPT = "<script>alert('x')</script>"
ESCAPED_SCRIPT = "&lt;script&gt;alert(&#x27;x&#x27;)&lt;/script&gt;"
DECLINED = "shop.PaymentDeclined"


@pytest.fixture(autouse=True)
def _outbox_app(settings: Any) -> None:
    """Requeue through the test app (``tests.django.admin_app``)."""
    settings.DJANGO_OUTBOX_CELERY_APP = APP_PATH


def recent_letter(**fields: Any) -> DeadLetter:
    """A dead letter that failed a minute ago."""
    now = utcnow()
    return make_letter(
        **{"failed_at": now - timedelta(minutes=1), "first_failed_at": now, **fields}
    )


def group_data(letter: DeadLetter, **extra: str) -> dict[str, str]:
    """The POST data of the group of ``letter``, up to it."""
    return {
        "task": letter.task_name,
        "exception": letter.exception_type,
        "upto": str(letter.pk),
        **extra,
    }


def test_the_overview_is_listed_in_the_outbox_section(admin_client: Client) -> None:
    response = admin_client.get(reverse("admin:app_list", args=["django_outbox"]))
    assert response.status_code == 200
    assert OVERVIEW in response.content.decode()


def test_the_page_shows_the_backlog_letters_parked_rows_and_workflows(
    admin_client: Client,
) -> None:
    now = utcnow()
    dispatch_row()  # due now
    parked = dispatch_row(countdown=3600)
    OutboxMessage.objects.filter(pk=parked.pk).update(available_at=now + timedelta(hours=1))
    failed = dispatch_row(countdown=7200)
    OutboxMessage.objects.filter(pk=failed.pk).update(status=MessageStatus.FAILED.value)
    SweepRecord.objects.create(name="sweep", last_sweep_at=now - timedelta(seconds=5))
    Workflow.objects.create(
        root_id="r1",
        name="shop.order",
        status="running",
        steps_total=2,
        steps_done=0,
        created_at=now,
    )
    for _ in range(3):
        recent_letter(exception_type=DECLINED)
    recent_letter(task_name=OTHER)

    response = admin_client.get(OVERVIEW)

    assert response.status_code == 200
    overview = response.context["overview"]
    figures = [overview.due, overview.parked, overview.failed, overview.pending]
    assert [str(f) for f in figures] == ["1", "1", "1", "2"]
    assert not overview.estimated
    assert overview.last_sweep is not None
    assert str(overview.workflows["running"]) == "1"
    assert [(g.task_name, g.exception_type, g.count) for g in overview.groups] == [
        (RECORD, DECLINED, 3),
        (OTHER, "builtins.ValueError", 1),
    ]
    assert [row.task_id for row in overview.parked_rows] == [parked.task_id]
    assert sum(h.count.value for h in overview.dead_letters) == 4
    page = response.content.decode()
    assert "<svg" in page
    assert "Dead letters per hour" in page
    assert "Publishes are not charted" in page  # outbox_keep_published is 0 here
    assert page.count("outbox-requeue-group") == 2
    assert page.count("outbox-discard-group") == 2


def test_a_user_without_the_view_permissions_cannot_open_it() -> None:
    response = client_for(staff("nobody")).get(OVERVIEW)
    assert response.status_code == 403


def test_a_message_viewer_sees_the_backlog_but_no_dead_letters() -> None:
    recent_letter(exception_message="secret detail")
    response = client_for(staff("watcher", "view_outboxmessage")).get(OVERVIEW)
    assert response.status_code == 200
    page = response.content.decode()
    assert "outbox-backlog" in page
    assert "secret detail" not in page
    assert "outbox-groups" not in page


@pytest.mark.parametrize(
    ("perms", "requeue", "discard"),
    [
        (("view_deadletter",), False, False),
        (("view_deadletter", "requeue_deadletter"), True, False),
        (("view_deadletter", "discard_deadletter"), False, True),
        (("requeue_deadletter", "discard_deadletter", "view_outboxmessage"), False, False),
    ],
)
def test_each_button_is_shown_only_with_its_permission(
    perms: tuple[str, ...], requeue: bool, discard: bool
) -> None:
    recent_letter()
    page = client_for(staff("someone", *perms)).get(OVERVIEW).content.decode()
    assert ("outbox-requeue-group" in page) is requeue
    assert ("outbox-discard-group" in page) is discard


@pytest.mark.parametrize(
    ("perms", "url"),
    [
        (("view_deadletter", "discard_deadletter"), REQUEUE),
        (("view_deadletter", "requeue_deadletter"), DISCARD),
        (("requeue_deadletter", "discard_deadletter"), REQUEUE),
    ],
)
def test_a_forged_post_without_the_permission_is_refused(perms: tuple[str, ...], url: str) -> None:
    letter = recent_letter()
    client = client_for(staff("forger", *perms))
    assert client.get(url, group_data(letter)).status_code == 403
    assert client.post(url, group_data(letter, confirmed="yes")).status_code == 403
    letter.refresh_from_db()
    assert letter.status == DeadLetterStatus.DEAD.value


def test_the_button_shows_a_confirmation_and_changes_nothing(admin_client: Client) -> None:
    letters = [recent_letter(exception_type=DECLINED) for _ in range(3)]
    response = admin_client.post(REQUEUE, group_data(letters[-1]))
    assert response.status_code == 200
    assert response.context["count"] == 3
    page = response.content.decode()
    assert 'name="confirmed" value="yes"' in page
    assert DECLINED in page
    assert DeadLetter.objects.filter(status=DeadLetterStatus.DEAD.value).count() == 3


def test_requeue_group_requeues_the_group_up_to_the_letter_seen(admin_user: User) -> None:
    group = [recent_letter(exception_type=DECLINED) for _ in range(2)]
    later = recent_letter(exception_type=DECLINED)  # failed after the page was read
    other = recent_letter(exception_type="builtins.KeyError")
    response = client_for(admin_user).post(
        REQUEUE, group_data(group[-1], confirmed="yes"), follow=True
    )
    assert response.redirect_chain[-1][0] == OVERVIEW
    assert shown_messages(response) == ["2 dead letters were requeued."]
    statuses = dict(DeadLetter.objects.values_list("pk", "status"))
    assert [statuses[letter.pk] for letter in group] == ["requeued", "requeued"]
    assert statuses[later.pk] == statuses[other.pk] == "dead"
    requeued = DeadLetter.objects.filter(pk__in=[g.pk for g in group])
    assert {letter.requeued_by for letter in requeued} == {admin_user.get_username()}
    new_ids = {letter.requeued_task_id for letter in requeued}
    assert set(OutboxMessage.objects.values_list("task_id", flat=True)) == new_ids


def test_discard_group_discards_the_group(admin_user: User) -> None:
    group = [recent_letter(exception_type=DECLINED) for _ in range(2)]
    other = recent_letter()
    response = client_for(admin_user).post(
        DISCARD, group_data(group[-1], confirmed="yes"), follow=True
    )
    assert shown_messages(response) == ["2 dead letters were discarded."]
    assert set(DeadLetter.objects.filter(status="discarded").values_list("pk", flat=True)) == {
        g.pk for g in group
    }
    other.refresh_from_db()
    assert other.status == DeadLetterStatus.DEAD.value


def test_a_confirmation_post_without_the_csrf_token_is_refused(admin_user: User) -> None:
    letter = recent_letter()
    client = client_for(admin_user, csrf=True)
    response = client.post(REQUEUE, group_data(letter, confirmed="yes"))
    assert response.status_code == 403
    letter.refresh_from_db()
    assert letter.status == DeadLetterStatus.DEAD.value


@pytest.mark.parametrize(
    ("data", "named"),
    [({"task": RECORD, "exception": "x", "upto": "ten"}, "upto='ten'"), ({}, "task=''")],
)
def test_a_bad_group_is_a_clear_400(admin_client: Client, data: dict[str, str], named: str) -> None:
    response = admin_client.post(REQUEUE, data)
    assert response.status_code == 400
    assert named in response.content.decode()


def test_an_unknown_action_is_a_clear_400(admin_client: Client) -> None:
    url = reverse("admin:django_outbox_overview_group", args=["delete"])
    response = admin_client.post(url, {})
    assert response.status_code == 400
    assert "action='delete'" in response.content.decode()


def test_script_in_a_message_or_names_is_escaped(admin_client: Client) -> None:
    recent_letter(exception_message=SCRIPT, exception_type=SCRIPT, task_name=SCRIPT)
    page = admin_client.get(OVERVIEW).content.decode()
    assert SCRIPT not in page
    assert ESCAPED_SCRIPT in page
    letter = DeadLetter.objects.get()
    confirm = admin_client.post(DISCARD, group_data(letter)).content.decode()
    assert SCRIPT not in confirm
    assert ESCAPED_SCRIPT in confirm


def test_published_rows_are_charted_when_they_are_kept(
    admin_client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from tests.django import admin_app

    state = state_of(admin_app.app)
    kept = replace(OutboxConfig.from_celery(admin_app.app), keep_published=timedelta(hours=1))
    monkeypatch.setattr(state, "config", kept)
    rows = [dispatch_row() for _ in range(2)]
    OutboxMessage.objects.filter(pk__in=[r.pk for r in rows]).update(
        status=MessageStatus.PUBLISHED.value, published_at=utcnow()
    )
    response = admin_client.get(OVERVIEW)
    overview = response.context["overview"]
    assert overview.keeps_published
    assert sum(h.count.value for h in overview.publishes) == 2
    page = response.content.decode()
    assert "Publishes per hour" in page
    assert "Publishes are not charted" not in page
