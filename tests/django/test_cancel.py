"""Cancelling outbox rows on real PostgreSQL: ``cancel_messages`` and ``outbox cancel``.

The revoke goes through the test app's in-memory broker here (a worker hearing it:
``test_cancel_worker.py``); what is checked is what the database and the admin log hold.
"""

from __future__ import annotations

import io
import uuid
from datetime import timedelta
from typing import Any

import pytest
from django.contrib.admin.models import DELETION, LogEntry
from django.contrib.auth.models import User
from django.core.management import call_command
from django.core.management.base import CommandError
from django.db import transaction
from django.test import Client
from django.urls import reverse

from celery_outbox.cancelling import ANNOUNCED_IDS
from celery_outbox.clock import utcnow
from celery_outbox.registry import store_for
from celery_outbox.store.records import MessageStatus
from celery_outbox.worker.attempt import Attempt
from celery_outbox.worker.steps import Step
from celery_outbox.workflows.dispatch import JOIN_HEADER
from django_outbox.cancelling import cancel_messages
from django_outbox.models import ChordJoin, OutboxMessage, Workflow
from tests.django.admin_app import APP_PATH, app
from tests.django.celery_app import RECORD

pytestmark = pytest.mark.django_db(transaction=True)


@pytest.fixture(autouse=True)
def _outbox_app(settings: Any) -> None:
    settings.DJANGO_OUTBOX_CELERY_APP = APP_PATH


@pytest.fixture
def alice() -> User:
    return User.objects.create_user("alice", is_staff=True)


def row(status: str = MessageStatus.PENDING.value, **fields: Any) -> OutboxMessage:
    """An outbox row of a fresh task id, due now unless ``fields`` say otherwise."""
    values: dict[str, Any] = {
        "task_id": str(uuid.uuid4()),
        "task_name": "django_e2e.record",
        "payload": "[[], {}, {}]",
        "options": {"headers": {"retries": 3}},
        "status": status,
        "available_at": utcnow(),
    }
    values.update(fields)
    return OutboxMessage.objects.create(**values)


def app_store() -> Any:
    return store_for(app)


def cancel(*args: str) -> str:
    out = io.StringIO()
    call_command("outbox", "cancel", *args, stdout=out)
    return out.getvalue()


def test_pending_and_parked_rows_are_deleted_logged_and_revoked(alice: User) -> None:
    due, parked = row(), row(available_at=utcnow() + timedelta(hours=1))
    failed = row(MessageStatus.FAILED.value)
    result = cancel_messages(OutboxMessage.objects.all(), by=alice, app=app)
    assert result.cancelled == {due.pk: due.task_id, parked.pk: parked.task_id}
    assert (result.skipped, result.in_flight, result.revoked) == (1, (), True)
    assert list(OutboxMessage.objects.values_list("id", flat=True)) == [failed.pk]
    # object_id is text: order numerically (ids 9 and 10 sort the wrong way as text).
    entries = sorted(LogEntry.objects.all(), key=lambda e: int(e.object_id))
    assert [(e.user_id, e.object_id, e.action_flag) for e in entries] == [
        (alice.pk, str(due.pk), DELETION),
        (alice.pk, str(parked.pk), DELETION),
    ]
    assert due.task_id in entries[0].change_message


def test_a_cancelled_workflow_step_closes_its_workflow_and_chord_join(alice: User) -> None:
    store = app_store()
    now = utcnow()
    store.add_workflow_steps("root-cancel", name="tests.chord", steps=3, now=now)
    store.open_join("group-cancel", root_id="root-cancel", size=2, now=now)
    step = row(options={"headers": {"retries": 0, "root_id": "root-cancel"}})

    result = cancel_messages(OutboxMessage.objects.filter(pk=step.pk), by=alice, app=app)

    assert result.cancelled == {step.pk: step.task_id}
    workflow = Workflow.objects.get(root_id="root-cancel")
    assert workflow.status == "cancelled"
    assert workflow.finished_at is not None
    assert not ChordJoin.objects.filter(root_id="root-cancel").exists()
    out = io.StringIO()
    call_command("outbox", "status", "--json", stdout=out)
    assert '"cancelled": 1' in out.getvalue()


def test_a_leased_row_is_reported_in_flight(caplog: pytest.LogCaptureFixture) -> None:
    taken = row(locked_until=utcnow() + timedelta(seconds=60))
    result = cancel_messages(OutboxMessage.objects.all(), app=app)
    assert result.in_flight == (taken.task_id,)
    assert result.revoked
    assert not OutboxMessage.objects.exists()
    assert not LogEntry.objects.exists()  # no user: no admin-log entry, but a log line
    assert (
        f"by no user (not in the admin log), never to be published: task ids {taken.task_id}"
        in caplog.text
    )


def test_each_committed_cancel_is_logged_with_who(
    alice: User, caplog: pytest.LogCaptureFixture
) -> None:
    one, two = row(), row()
    cancel_messages(OutboxMessage.objects.all(), by="alice", app=app)
    [record] = [r for r in caplog.records if r.name == "django_outbox.cancelling"]
    assert record.levelname == "WARNING"
    assert record.getMessage() == (
        "Cancelled 2 outbox row(s) on database 'default' by 'alice', never to be published: "
        f"task ids {one.task_id}, {two.task_id}"
    )


def test_a_large_cancel_logs_one_line_naming_the_first_ids(
    caplog: pytest.LogCaptureFixture,
) -> None:
    rows = [row() for _ in range(ANNOUNCED_IDS + 5)]
    result = cancel_messages(OutboxMessage.objects.all(), app=app)
    assert len(result.cancelled) == ANNOUNCED_IDS + 5
    [record] = [r for r in caplog.records if r.name == "django_outbox.cancelling"]
    message = record.getMessage()
    assert message.startswith(f"Cancelled {ANNOUNCED_IDS + 5} outbox row(s)")
    assert message.endswith(" and 5 more")
    named = [r.task_id for r in rows if r.task_id in message]
    assert len(named) == ANNOUNCED_IDS


def test_inside_a_transaction_rolled_back_nothing_is_cancelled_or_revoked(
    alice: User, caplog: pytest.LogCaptureFixture
) -> None:
    kept = row()
    results = []

    def cancel_then_fail() -> None:
        with transaction.atomic():
            results.append(cancel_messages(OutboxMessage.objects.all(), by=alice, app=app))
            raise RuntimeError("roll back")

    with pytest.raises(RuntimeError):
        cancel_then_fail()
    assert results[0].cancelled == {kept.pk: kept.task_id}
    assert not results[0].revoked  # sent on commit only
    assert OutboxMessage.objects.filter(pk=kept.pk).exists()
    assert not LogEntry.objects.exists()
    assert "Cancelled" not in caplog.text  # rolled back: nothing to log


def test_an_unknown_username_is_refused_before_anything_changes() -> None:
    kept = row()
    with pytest.raises(LookupError, match="no user 'nobody'"):
        cancel_messages(OutboxMessage.objects.all(), by="nobody", app=app)
    assert OutboxMessage.objects.filter(pk=kept.pk).exists()


def test_a_broker_that_is_down_leaves_the_rows_cancelled_and_says_why(alice: User) -> None:
    kept = row(locked_until=utcnow())
    previous = app.conf.broker_write_url
    app.conf.broker_write_url = "redis://127.0.0.1:1/0"  # nothing listens on port 1
    try:
        result = cancel_messages(OutboxMessage.objects.all(), by=alice, app=app)
    finally:
        app.conf.broker_write_url = previous
    assert result.cancelled == {kept.pk: kept.task_id}
    assert (result.revoked, result.in_flight) == (False, (kept.task_id,))
    assert result.revoke_error.startswith("revoke not sent:")


def test_command_cancels_by_id_and_task_id(alice: User) -> None:
    one, two, other = row(), row(), row()
    out = cancel("--id", str(one.pk), "--task", two.task_id, "--by", "alice")
    assert set(OutboxMessage.objects.values_list("id", flat=True)) == {other.pk}
    assert f"cancelled #{one.pk} task {one.task_id}" in out
    assert "default: cancelled 2 row(s), 0 in flight, 0 skipped; revoke sent" in out
    assert LogEntry.objects.filter(user=alice).count() == 2


def test_command_dry_run_lists_and_keeps(alice: User) -> None:
    kept = row()
    out = cancel("--task", kept.task_id, "--dry-run")
    assert f"would cancel #{kept.pk} django_e2e.record[{kept.task_id}]" in out
    assert "default: would cancel 1 row(s) (dry run)" in out
    assert OutboxMessage.objects.filter(pk=kept.pk).exists()


def test_command_skips_failed_rows(alice: User) -> None:
    failed = row(MessageStatus.FAILED.value)
    out = cancel("--id", str(failed.pk), "--by", "alice")
    assert "cancelled 0 row(s)" in out
    assert OutboxMessage.objects.filter(pk=failed.pk).exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((), "give --id ROW_ID or --task TASK_ID"),
        (("--id", "1"), "give --by USERNAME"),
        (("--id", "0", "--by", "alice"), "'0' is not accepted: give"),
        (("--id", "x", "--by", "alice"), "'x' is not accepted: give"),
        (("--task", "", "--by", "alice"), "--task '' is not accepted: give a task id of 1 to"),
        (("--task", "t" * 300, "--by", "alice"), "is not accepted: give a task id of 1 to 255"),
        (("--id", "1", "--by", "bob"), "--by 'bob' is not accepted: no user 'bob'"),
        (("--id", "1", "--by", "alice", "--database", "nope"), "--database 'nope'"),
    ],
)
def test_command_refuses_bad_input_naming_it(
    alice: User, args: tuple[str, ...], message: str
) -> None:
    kept = row()
    with pytest.raises(CommandError, match=message.replace("(", r"\(")):
        cancel(*args)
    assert OutboxMessage.objects.filter(pk=kept.pk).exists()


@pytest.mark.django_db(databases=["default", "other"], transaction=True)
def test_a_header_step_on_another_database_finds_its_chord_closed_by_a_cancel() -> None:
    # The chord of a workflow on alias "other" (its steps dispatched with using="other"):
    # one header step is cancelled, the other then finishes on that database.
    store, now = app_store(), utcnow()
    root_id, group_id = str(uuid.uuid4()), str(uuid.uuid4())
    store.add_workflow_steps(root_id, name="tests.chord", steps=3, now=now, using="other")
    store.open_join(group_id, root_id=root_id, size=2, now=now, using="other")
    headers = {"root_id": root_id, JOIN_HEADER: group_id}
    doomed = OutboxMessage.objects.using("other").create(
        task_id=str(uuid.uuid4()),
        task_name=RECORD,
        payload="[[], {}, {}]",
        options={"headers": headers},
        available_at=now + timedelta(hours=1),
    )
    cancel_messages(OutboxMessage.objects.using("other").filter(pk=doomed.pk), app=app)
    task = app.tasks[RECORD]
    options = {"root_id": root_id, "group_id": group_id, "group_index": 0, "chord": {}}
    attempt = Attempt(task_name=RECORD, task_id="the-other-step", options=options, using="other")
    step = Step(task=task, attempt=attempt, root=root_id, join=group_id, index=0)

    with transaction.atomic(using="other"):
        step.committing(None, None, durable=lambda _: True)  # no JoinMissing: the chord is closed

    closed = Workflow.objects.using("other").get(root_id=root_id)
    assert (closed.status, closed.steps_done) == ("cancelled", 1)


def test_the_admin_list_the_overview_and_the_metrics_count_a_cancelled_workflow(
    alice: User, admin_client: Client, settings: Any
) -> None:
    store, root_id = app_store(), str(uuid.uuid4())
    store.add_workflow_steps(root_id, name="shop.checkout", steps=2, now=utcnow())
    step = row(options={"headers": {"root_id": root_id}})

    cancel("--task", step.task_id, "--by", "alice")

    workflows = reverse("admin:django_outbox_workflow_changelist")
    listed = admin_client.get(workflows, {"status__exact": "cancelled"}).context["cl"]
    assert [w.root_id for w in listed.result_list] == [root_id]
    overview = admin_client.get(reverse("admin:django_outbox_overview_changelist"))
    assert str(overview.context["overview"].workflows["cancelled"]) == "1"
    assert "workflows: running 0, succeeded 0, failed 0, cancelled 1" in outbox("status")
    settings.DJANGO_OUTBOX_METRICS_TOKEN = "scrape"
    scraped = Client().get(
        reverse("django_outbox:metrics"), headers={"Authorization": "Bearer scrape"}
    )
    assert 'celery_outbox_workflows{status="cancelled"} 1.0' in scraped.content.decode()


def outbox(*args: str) -> str:
    out = io.StringIO()
    call_command("outbox", *args, stdout=out)
    return out.getvalue()
