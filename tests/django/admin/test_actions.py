"""The admin actions' logic on real PostgreSQL, called as plain functions (no request)."""

from __future__ import annotations

from datetime import timedelta
from typing import Any

import pytest
from celery import _state as celery_state
from django.contrib import messages
from django.contrib.auth.models import User

from celery_outbox.clock import utcnow
from celery_outbox.exceptions import OutboxConfigError
from celery_outbox.store.records import DeadLetterStatus, MessageStatus
from django_outbox.admin import actions as admin_actions
from django_outbox.celery_app import outbox_app
from django_outbox.dead_letters import (
    RequeueResult,
    discard_letter,
    discard_letters,
    requeue_letter,
    requeue_letters,
)
from django_outbox.models import DeadLetter, OutboxMessage
from django_outbox.store.calls import clock_of
from tests.django import admin_app
from tests.django.admin_app import APP_PATH, dispatch_row, make_letter

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _outbox_app(settings: Any) -> None:
    """Requeue through the test app (``tests.django.admin_app``)."""
    settings.DJANGO_OUTBOX_CELERY_APP = APP_PATH


@pytest.fixture
def alice() -> User:
    """A user to requeue as."""
    user: User = User.objects.create_user("alice", is_staff=True)
    return user


def test_requeue_acts_only_on_dead_letters(alice: User) -> None:
    dead = [make_letter(), make_letter()]
    done = make_letter(status=DeadLetterStatus.DISCARDED.value)

    result = requeue_letters(DeadLetter.objects.all(), by=admin_actions.actor_name(alice))

    assert set(result.requeued) == {dead[0].pk, dead[1].pk}
    assert (result.skipped, result.failed) == (1, {})
    rows = OutboxMessage.objects.order_by("id")
    assert sorted(r.task_id for r in rows) == sorted(result.requeued.values())
    assert {r.status for r in rows} == {MessageStatus.PENDING.value}
    done.refresh_from_db()
    assert done.status == DeadLetterStatus.DISCARDED.value


def test_requeue_records_who_and_the_new_task_id(alice: User) -> None:
    letter = make_letter()
    result = requeue_letters(DeadLetter.objects.all(), by=admin_actions.actor_name(alice))
    letter.refresh_from_db()
    assert letter.status == DeadLetterStatus.REQUEUED.value
    assert letter.requeued_by == "alice"
    assert letter.requeued_at is not None
    assert letter.requeued_task_id == result.requeued[letter.pk] != letter.task_id


def test_requeue_twice_makes_one_row_and_returns_the_existing_id() -> None:
    letter = make_letter()
    first = requeue_letter(letter, by="test")
    second = requeue_letter(letter, by="test")
    assert first == second
    assert list(OutboxMessage.objects.values_list("task_id", flat=True)) == [first]


def test_requeued_message_keeps_args_and_queue() -> None:
    letter = make_letter(args=[7], kwargs={"using": "default"})
    requeue_letter(letter, by="test")
    row = OutboxMessage.objects.get()
    assert row.task_name == letter.task_name
    assert row.options["routing_key"] == "outbox-admin-tests"
    assert '[7], {"using": "default"}' in row.payload


def test_one_unregistered_task_does_not_stop_the_others(alice: User) -> None:
    good = make_letter()
    bad = make_letter(task_name="no.such.task")
    result = requeue_letters(DeadLetter.objects.all(), by=admin_actions.actor_name(alice))
    assert list(result.requeued) == [good.pk]
    assert "no.such.task" in result.failed[bad.pk]
    bad.refresh_from_db()
    assert bad.status == DeadLetterStatus.DEAD.value


def test_arguments_the_task_no_longer_accepts_do_not_stop_the_others(alice: User) -> None:
    good = make_letter()
    stale = make_letter(args=[1, 2, 3, 4])  # written by a version whose record took more
    result = requeue_letters(DeadLetter.objects.all(), by=admin_actions.actor_name(alice))
    assert list(result.requeued) == [good.pk]
    assert f"dead letter {stale.pk} of task" in result.failed[stale.pk]
    assert "args=(1, 2, 3, 4)" in result.failed[stale.pk]
    stale.refresh_from_db()
    assert stale.status == DeadLetterStatus.DEAD.value


def test_discard_acts_only_on_dead_letters() -> None:
    dead = make_letter()
    requeued = make_letter(status=DeadLetterStatus.REQUEUED.value, requeued_task_id="x")
    assert discard_letters(DeadLetter.objects.all()) == 1
    dead.refresh_from_db()
    requeued.refresh_from_db()
    assert dead.status == DeadLetterStatus.DISCARDED.value
    assert requeued.status == DeadLetterStatus.REQUEUED.value
    assert discard_letter(dead) is False


def test_requeue_report_counts_with_plurals() -> None:
    one = admin_actions.requeue_messages(RequeueResult(requeued={1: "a"}))
    two = admin_actions.requeue_messages(RequeueResult(requeued={1: "a", 2: "b"}, skipped=1))
    assert one == [(messages.SUCCESS, "1 dead letter was requeued.")]
    assert two[0] == (messages.SUCCESS, "2 dead letters were requeued.")
    assert two[1][0] == messages.WARNING
    assert two[1][1].startswith("1 selected letter was skipped")


def test_requeue_report_lists_failures() -> None:
    failed = {n: f"reason {n}" for n in range(1, 8)}
    report = admin_actions.requeue_messages(RequeueResult(failed=failed))
    assert [level for level, _ in report] == [messages.ERROR]
    text = report[0][1]
    assert text.startswith("7 dead letters could not be requeued: #1: reason 1")
    assert "#6" not in text
    assert text.endswith("(and 2 more)")


def test_discard_report() -> None:
    assert admin_actions.discard_messages(3, 2) == [
        (messages.SUCCESS, "2 dead letters were discarded."),
        (messages.WARNING, "1 selected letter was skipped: it is not dead."),
    ]


def test_publish_now_makes_pending_rows_due_and_publishes_them_on_commit(
    django_capture_on_commit_callbacks: Any,
) -> None:
    later = dispatch_row(countdown=3600)
    failed = dispatch_row()
    OutboxMessage.objects.filter(pk=failed.pk).update(status=MessageStatus.FAILED.value)
    assert later.available_at > utcnow() + timedelta(minutes=30)

    with django_capture_on_commit_callbacks(execute=True) as callbacks:
        changed = admin_actions.publish_messages_now(OutboxMessage.objects.all())

    assert changed == 1
    assert len(callbacks) == 1
    # Published on the (in-memory) broker: the row is gone, the failed one untouched.
    assert list(OutboxMessage.objects.values_list("id", "status")) == [
        (failed.pk, MessageStatus.FAILED.value)
    ]


def test_reset_gives_failed_rows_a_fresh_budget() -> None:
    failed = dispatch_row()
    pending = dispatch_row(countdown=3600)
    OutboxMessage.objects.filter(pk=failed.pk).update(
        status=MessageStatus.FAILED.value, attempts=20, last_error="down"
    )
    changed = admin_actions.reset_failed_messages(OutboxMessage.objects.all())
    assert changed == 1
    failed.refresh_from_db()
    assert (failed.status, failed.attempts) == (MessageStatus.PENDING.value, 0)
    assert failed.available_at <= clock_of("default")()  # due now, by the database's clock
    pending_before = pending.available_at
    pending.refresh_from_db()
    assert pending.available_at == pending_before


def test_reset_skips_a_failed_row_whose_task_already_has_a_pending_row() -> None:
    pending = dispatch_row()
    OutboxMessage.objects.create(
        task_id=pending.task_id,
        task_name=pending.task_name,
        payload=pending.payload,
        options=pending.options,
        status=MessageStatus.FAILED.value,
        available_at=pending.available_at,
        attempts=20,
    )
    assert admin_actions.reset_failed_messages(OutboxMessage.objects.all()) == 0
    assert admin_actions.reset_messages(1, 0)[1][0] == messages.WARNING


def test_publish_now_report() -> None:
    assert admin_actions.publish_now_messages(1, 1) == [
        (messages.SUCCESS, "1 outbox message is being published.")
    ]


# -- which Celery app ------------------------------------------------------------------------
@pytest.fixture
def no_app(settings: Any, monkeypatch: pytest.MonkeyPatch) -> None:
    """No DJANGO_OUTBOX_CELERY_APP, and no Celery app created in this process yet."""
    settings.DJANGO_OUTBOX_CELERY_APP = None
    monkeypatch.setattr(celery_state._tls, "current_app", None)
    monkeypatch.setattr(celery_state, "default_app", None)


def test_outbox_app_names_a_setting_it_cannot_import(settings: Any) -> None:
    settings.DJANGO_OUTBOX_CELERY_APP = "no.such.module:app"
    with pytest.raises(OutboxConfigError, match=r"DJANGO_OUTBOX_CELERY_APP='no\.such\.module:app'"):
        outbox_app()


@pytest.mark.usefixtures("no_app")
def test_outbox_app_refuses_when_the_project_made_no_app() -> None:
    with pytest.raises(OutboxConfigError, match="No Celery app found"):
        outbox_app()
    celery_state.get_current_app()  # makes Celery's empty fallback app
    with pytest.raises(OutboxConfigError, match="No Celery app found"):
        outbox_app()


@pytest.mark.usefixtures("no_app")
def test_outbox_app_is_the_projects_app(monkeypatch: pytest.MonkeyPatch) -> None:
    # Celery's Django fixup makes the project's app the default app when it is created.
    monkeypatch.setattr(celery_state, "default_app", admin_app.app)
    assert outbox_app() is admin_app.app
