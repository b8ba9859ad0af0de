"""The read-only list of completed atomic tasks, through Django's test client on real
PostgreSQL: columns, filters, exact search, no result loaded on the list, read-only
detail, and no add/change/delete.
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import pytest
from django.contrib.auth.models import Permission, User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse

from django_outbox.models import CompletedTask

pytestmark = pytest.mark.django_db

LIST = reverse("admin:django_outbox_completedtask_changelist")
WHEN = datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone.utc)
SCRIPT = "<script>alert('x')</script>"


@pytest.fixture
def client(admin_user: User) -> Client:
    client = Client()
    client.force_login(admin_user)
    return client


def completed(task_id: str, name: str = "shop.charge", **fields: object) -> CompletedTask:
    row: CompletedTask = CompletedTask.objects.create(
        task_id=task_id, task_name=name, completed_at=fields.pop("completed_at", WHEN), **fields
    )
    return row


def listed(client: Client, **query: str) -> set[str]:
    response = client.get(LIST, query)
    assert response.status_code == 200
    return {row.task_id for row in response.context["cl"].result_list}


def test_the_list_shows_task_id_name_and_date_without_loading_the_result(
    client: Client,
) -> None:
    completed("charge-1", result='"r' + "x" * 5000 + '"')
    with CaptureQueriesContext(connection) as queries:
        response = client.get(LIST)
    content = response.content.decode()
    for header in ("Task id", "Task name", "Completed at"):
        assert header in content
    assert "charge-1" in content
    assert "shop.charge" in content
    pages = [
        q["sql"] for q in queries.captured_queries if "celery_outbox_completedtask" in q["sql"]
    ]
    page = [sql for sql in pages if sql.startswith('SELECT "celery_outbox_completedtask"."id"')]
    assert page, pages
    assert all('."result"' not in sql.split(" FROM ", 1)[0] for sql in page), pages


def test_filters_by_task_name_and_date(client: Client) -> None:
    completed("a", "shop.charge")
    completed("b", "shop.refund")
    completed("c", "shop.refund", completed_at=WHEN - timedelta(days=400))
    assert listed(client, task_name="shop.refund") == {"b", "c"}
    assert listed(client, completed_at__year="2025") == {"c"}
    since = {
        "completed_at__gte": "2026-03-01 00:00:00+00:00",
        "completed_at__lt": "2026-04-01 00:00:00+00:00",
    }
    assert listed(client, **since) == {"a", "b"}


def test_search_is_an_exact_task_id(client: Client) -> None:
    completed("order-1234")
    completed("order-12345")
    assert listed(client, q="order-1234") == {"order-1234"}
    assert listed(client, q=" order-12345 ") == {"order-12345"}
    assert listed(client, q="order") == set()


def test_detail_is_read_only_and_escaped(client: Client) -> None:
    row = completed("t", name=SCRIPT, result=f'"{SCRIPT}"')
    response = client.get(reverse("admin:django_outbox_completedtask_change", args=[row.pk]))
    content = response.content.decode()
    assert response.status_code == 200
    assert SCRIPT not in content
    assert '<pre class="outbox-pre">&quot;&lt;script&gt;' in content
    assert 'name="_save"' not in content
    none = completed("none")
    response = client.get(reverse("admin:django_outbox_completedtask_change", args=[none.pk]))
    assert response.status_code == 200


def test_no_add_change_or_delete(client: Client) -> None:
    row = completed("t")
    assert client.get(reverse("admin:django_outbox_completedtask_add")).status_code == 403
    delete = reverse("admin:django_outbox_completedtask_delete", args=[row.pk])
    assert client.get(delete).status_code == 403
    change = reverse("admin:django_outbox_completedtask_change", args=[row.pk])
    assert client.post(change, {"task_name": "x"}).status_code == 403
    response = client.get(LIST)
    form = response.context["action_form"]
    assert form is None or "delete_selected" not in {n for n, _ in form.fields["action"].choices}
    row.refresh_from_db()
    assert row.task_name == "shop.charge"


def test_staff_need_the_view_permission() -> None:
    user: User = User.objects.create_user("clerk", password="pw", is_staff=True)
    client = Client()
    client.force_login(user)
    assert client.get(LIST).status_code == 403
    user.user_permissions.set(Permission.objects.filter(codename="view_completedtask"))
    client.force_login(User.objects.get(pk=user.pk))
    assert client.get(LIST).status_code == 200
