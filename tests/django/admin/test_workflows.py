"""The read-only workflow admin, through Django's test client on real PostgreSQL: the
list (columns, filters, exact search), a workflow's page with its done, dead and pending
steps linked, escaping, the dead letter's link back, and no add/change/delete.
"""

from __future__ import annotations

import re
from datetime import datetime, timedelta, timezone

import pytest
from django.contrib.auth.models import Permission, User
from django.test import Client
from django.urls import NoReverseMatch, reverse

from celery_outbox.store.records import MessageStatus
from django_outbox.models import CompletedTask, OutboxMessage, Workflow
from tests.django.admin_app import make_letter

pytestmark = pytest.mark.django_db

LIST = reverse("admin:django_outbox_workflow_changelist")
WHEN = datetime(2026, 3, 4, 5, 6, 7, tzinfo=timezone.utc)
SCRIPT = "<script>alert('x')</script>"


@pytest.fixture
def client(admin_user: User) -> Client:
    client = Client()
    client.force_login(admin_user)
    return client


def workflow(root_id: str, name: str = "shop.checkout", **fields: object) -> Workflow:
    values: dict[str, object] = {
        "status": "running",
        "steps_total": 5,
        "steps_done": 2,
        "created_at": WHEN,
    }
    values.update(fields)
    row: Workflow = Workflow.objects.create(root_id=root_id, name=name, **values)
    return row


def listed(client: Client, **query: str) -> set[str]:
    response = client.get(LIST, query)
    assert response.status_code == 200
    return {row.root_id for row in response.context["cl"].result_list}


def page(client: Client, row: Workflow) -> str:
    response = client.get(reverse("admin:django_outbox_workflow_change", args=[row.pk]))
    assert response.status_code == 200
    return str(response.content.decode())


def pending_row(task_id: str, root_id: str, status: str = MessageStatus.PENDING.value) -> None:
    OutboxMessage.objects.create(
        task_id=task_id,
        task_name="shop.ship",
        payload="[[], {}, {}]",
        options={"headers": {"id": task_id, "root_id": root_id}},
        status=status,
        available_at=WHEN,
    )


def test_the_list_shows_root_id_name_status_progress_and_dates(client: Client) -> None:
    workflow("root-1", finished_at=WHEN + timedelta(minutes=1), status="succeeded")
    content = client.get(LIST).content.decode()
    for header in ("Root id", "Name", "Status", "Steps done", "Created at", "Finished at"):
        assert header in content
    assert "root-1" in content
    assert "shop.checkout" in content
    assert "2 / 5" in content


def test_filters_by_status_and_name_and_searches_an_exact_root_id(client: Client) -> None:
    workflow("a", status="failed")
    workflow("b", name="shop.refund")
    workflow("abc", name="shop.refund", status="succeeded")
    assert listed(client, status="failed") == {"a"}
    assert listed(client, name="shop.refund") == {"b", "abc"}
    assert listed(client, name="shop.refund", status="running") == {"b"}
    assert listed(client, q=" abc ") == {"abc"}
    assert listed(client, q="ab") == set()
    content = client.get(LIST).content.decode()
    assert "By status" in content
    assert "By name" in content


def test_a_workflow_page_lists_its_steps_with_links(client: Client) -> None:
    row = workflow("root-1", status="failed", failed_task_id="step-3")
    done = CompletedTask.objects.create(
        task_id="step-1", task_name="shop.charge", completed_at=WHEN, root_id="root-1"
    )
    CompletedTask.objects.create(
        task_id="other-1", task_name="shop.charge", completed_at=WHEN, root_id="root-2"
    )
    letter = make_letter(task_id="step-3", options={"canvas": {"root_id": "root-1"}})
    first = make_letter(task_id="root-1", options={"canvas": {"chain": [{"task": "t"}]}})
    make_letter(task_id="root-1", task_name="shop.again")  # not a step: no canvas
    make_letter(task_id="other-3", options={"canvas": {"root_id": "root-2"}})
    make_letter(task_id="plain-3")
    pending_row("step-4", "root-1")
    pending_row("step-5", "root-1", status=MessageStatus.FAILED.value)
    pending_row("other-4", "root-2")
    content = page(client, row)
    done_url = reverse("admin:django_outbox_completedtask_change", args=[done.pk])
    letter_url = reverse("admin:django_outbox_deadletter_change", args=[letter.pk])
    pending = OutboxMessage.objects.get(task_id="step-4")
    pending_url = reverse("admin:django_outbox_outboxmessage_change", args=[pending.pk])
    assert f'<a href="{done_url}">step-1</a>' in content
    assert f'<a href="{letter_url}">step-3</a>' in content
    assert content.count(f'<a href="{letter_url}">step-3</a>') == 2  # failed task id too
    first_url = reverse("admin:django_outbox_deadletter_change", args=[first.pk])
    assert f'<a href="{first_url}">root-1</a>' in content
    assert "shop.again" not in content
    assert f'<a href="{pending_url}">step-4</a>' in content
    for elsewhere in ("other-1", "other-3", "plain-3", "other-4", "step-5"):
        assert elsewhere not in content
    assert "2 / 5" in content
    assert 'name="_save"' not in content


def test_a_workflow_without_steps_and_a_long_one_render(client: Client) -> None:
    # finished at, failed task id, and the three kinds of steps
    assert page(client, workflow("empty")).count('<div class="readonly">-</div>') == 5
    row = workflow("long")
    CompletedTask.objects.bulk_create(
        CompletedTask(task_id=f"s-{n}", task_name="n", completed_at=WHEN, root_id="long")
        for n in range(101)
    )
    content = page(client, row)
    assert len(re.findall(r"/django_outbox/completedtask/\d+/change/", content)) == 100
    assert "Only the first 100 are shown." in content


def test_values_are_escaped(client: Client) -> None:
    row = workflow(SCRIPT, name=SCRIPT, failed_task_id=SCRIPT)
    CompletedTask.objects.create(
        task_id=SCRIPT, task_name=SCRIPT, completed_at=WHEN, root_id=SCRIPT
    )
    make_letter(task_id=SCRIPT, task_name=SCRIPT, options={"canvas": {"root_id": SCRIPT}})
    assert SCRIPT not in page(client, row)
    assert "&lt;script&gt;" in page(client, row)
    assert SCRIPT not in client.get(LIST).content.decode()


def test_a_dead_letter_links_to_its_workflow(client: Client) -> None:
    row = workflow("root-1")
    letter = make_letter(options={"canvas": {"root_id": "root-1"}})
    gone = make_letter(options={"canvas": {"root_id": "root-gone"}})
    first = make_letter(task_id="root-1", options={"canvas": {"chain": [{"task": "t"}]}})
    plain = make_letter()

    def letter_page(pk: int) -> str:
        url = reverse("admin:django_outbox_deadletter_change", args=[pk])
        return str(client.get(url).content.decode())

    url = reverse("admin:django_outbox_workflow_change", args=[row.pk])
    assert f'<a href="{url}">root-1</a>' in letter_page(letter.pk)
    assert "root-gone" in letter_page(gone.pk)
    assert f'<a href="{url}">root-1</a>' in letter_page(first.pk)
    assert '<div class="readonly">-</div>' in letter_page(plain.pk)


def test_no_add_change_or_delete(client: Client) -> None:
    row = workflow("root-1")
    assert client.get(reverse("admin:django_outbox_workflow_add")).status_code == 403
    delete = reverse("admin:django_outbox_workflow_delete", args=[row.pk])
    assert client.get(delete).status_code == 403
    change = reverse("admin:django_outbox_workflow_change", args=[row.pk])
    assert client.post(change, {"name": "x"}).status_code == 403
    form = client.get(LIST).context["action_form"]
    assert form is None or "delete_selected" not in {n for n, _ in form.fields["action"].choices}
    row.refresh_from_db()
    assert row.name == "shop.checkout"
    with pytest.raises(NoReverseMatch):  # chord joins are internal: no admin
        reverse("admin:django_outbox_chordjoin_changelist")
    assert "Chord joins" not in client.get(reverse("admin:index")).content.decode()


def test_staff_need_the_view_permission() -> None:
    user: User = User.objects.create_user("clerk", password="pw", is_staff=True)
    client = Client()
    client.force_login(user)
    assert client.get(LIST).status_code == 403
    user.user_permissions.set(Permission.objects.filter(codename="view_workflow"))
    client.force_login(User.objects.get(pk=user.pk))
    assert client.get(LIST).status_code == 200
