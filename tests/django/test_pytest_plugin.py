"""The pytest plugin's ``outbox`` fixture with pytest-django, the ORM store and real
PostgreSQL: ``django_db`` (the test's transaction never commits), ``transaction=True``
(real commits), a second database alias, and ``drain(publish=True)`` to a real broker.

The fixture is imported as a user's ``conftest.py`` would get it from the plugin.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery
from django.contrib.auth.models import User
from django.db import transaction

from celery_outbox import OutboxTask
from celery_outbox.pytest_plugin import outbox
from celery_outbox.state import reset
from celery_outbox.testing.recorder import DispatchState, OutboxRecorder
from django_outbox.models import OutboxMessage
from tests.brokers import take_task_ids
from tests.django.helpers import rolled_back

__all__ = ["outbox"]  # the plugin's fixture, as a user gets it

WELCOME = "plugin_django.welcome"
#: What ``welcome`` saw when it ran: (user id, whether that user existed in its database).
seen: list[tuple[int, bool]] = []


def welcome(user_id: int, using: str = "default") -> None:
    """Record whether the dispatching transaction's user is visible to the task."""
    seen.append((user_id, User.objects.using(using).filter(pk=user_id).exists()))


def make_app(broker: str, queue: str) -> Celery:
    app = Celery("plugin-django", broker=broker, set_as_current=False)
    app.conf.update(task_default_queue=queue, broker_connection_retry_on_startup=True)
    app.task(base=OutboxTask, name=WELCOME, shared=False)(welcome)
    return app


@pytest.fixture
def outbox_celery_app(queue_name: str) -> Iterator[Celery]:
    """The plugin's app fixture, overridden as a user's conftest.py would."""
    app = make_app("memory://", queue_name)
    seen.clear()
    yield app
    reset(app)
    app.close()


def pending_task_ids(using: str = "default") -> list[str]:
    rows = OutboxMessage.objects.using(using).filter(status="pending").order_by("id")
    return list(rows.values_list("task_id", flat=True))


@pytest.mark.django_db
def test_django_db_keeps_what_would_commit_and_drains_it(
    outbox: OutboxRecorder, outbox_celery_app: Celery
) -> None:
    task = outbox_celery_app.tasks[WELCOME]
    with transaction.atomic():  # a savepoint inside the test's transaction
        ada = User.objects.create_user("ada")
        kept = task.delay(ada.pk)
    with rolled_back():
        task.delay(-1)
    outside = task.delay(-2)  # outside any block of the code under test

    assert [d.state for d in outbox.dispatches] == [
        DispatchState.AWAITING_COMMIT,
        DispatchState.ROLLED_BACK,
        DispatchState.AWAITING_COMMIT,
    ]
    outbox.assert_sent(task, args=(ada.pk,))
    outbox.assert_not_sent(task, args=(-1,))
    assert pending_task_ids() == [kept.id, outside.id]

    outbox.drain()

    assert seen == [(ada.pk, True), (-2, False)]
    assert pending_task_ids() == []


@pytest.mark.django_db(transaction=True)
def test_transaction_true_records_commits_and_holds_the_rows(
    outbox: OutboxRecorder, outbox_celery_app: Celery
) -> None:
    task = outbox_celery_app.tasks[WELCOME]
    with transaction.atomic():
        ada = User.objects.create_user("ada")
        task.delay(ada.pk)
        assert outbox.dispatches[0].state is DispatchState.AWAITING_COMMIT
    with rolled_back():
        task.delay(User.objects.create_user("bob").pk)

    assert [d.state for d in outbox.dispatches] == [
        DispatchState.COMMITTED,
        DispatchState.ROLLED_BACK,
    ]
    assert pending_task_ids() == [outbox.dispatches[0].task_id]  # committed, not published

    drained = outbox.drain()

    assert [d.task_id for d in drained] == [outbox.dispatches[0].task_id]
    assert seen == [(ada.pk, True)]
    assert pending_task_ids() == []


@pytest.mark.django_db(databases=["default", "other"], transaction=True)
def test_the_alias_is_recorded_and_drained_on_its_database(
    outbox: OutboxRecorder, outbox_celery_app: Celery
) -> None:
    task = outbox_celery_app.tasks[WELCOME]
    with transaction.atomic(using="other"):
        eve = User.objects.db_manager("other").create_user("eve")
        task.apply_async((eve.pk,), {"using": "other"}, using="other")

    with pytest.raises(AssertionError, match="using differs: expected 'default', got 'other'"):
        outbox.assert_sent(task, using="default")
    outbox.assert_sent(task, kwargs={"using": "other"}, using="other")
    assert (pending_task_ids("default"), len(pending_task_ids("other"))) == ([], 1)

    outbox.drain()

    assert seen == [(eve.pk, True)]
    assert pending_task_ids("other") == []


@pytest.mark.django_db(transaction=True)
def test_drain_publish_sends_the_kept_rows_to_a_real_broker(
    broker_url: str, broker_queue: str, queue_name: str
) -> None:
    app = make_app(broker_url, queue_name)
    try:
        with OutboxRecorder.recording(app) as recording:
            with transaction.atomic():
                first = app.tasks[WELCOME].delay(1)
                second = app.tasks[WELCOME].apply_async((2,), countdown=3600)
            with rolled_back():
                app.tasks[WELCOME].delay(3)
            recording.drain(publish=True)
        assert take_task_ids(broker_url, queue_name) == [first.id, second.id]
        assert pending_task_ids() == []
    finally:
        reset(app)
        app.close()
