"""A message for a task the worker does not know (:mod:`celery_outbox.worker.letters`):
Celery's ``task_unknown`` signal, given a real message from the memory broker, writes
its dead letter (arguments, routing, place in its canvas) and fails its workflow.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from celery import Celery
from celery.signals import task_unknown

from celery_outbox import requeue
from celery_outbox.registry import install_store
from celery_outbox.state import reset
from celery_outbox.testing import InMemoryOutboxStore
from celery_outbox.worker.letters import dead_letter_unknown
from tests.unit.worker.support import queued_messages

NOW = datetime(2026, 11, 27, tzinfo=UTC)


@pytest.fixture
def app(queue_name: str) -> Iterator[Celery]:
    app = Celery("unknown-unit", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = queue_name
    yield app
    reset(app)
    app.close()


class Consumer:
    """What ``task_unknown`` is sent by: the worker's consumer (its app and hostname)."""

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.hostname = "w1@host"


def test_an_unknown_tasks_message_is_a_dead_letter_that_fails_its_workflow(
    app: Celery, queue_name: str
) -> None:
    store = InMemoryOutboxStore()
    install_store(app, store)
    store.add_workflow_steps("root-9", name="chain", steps=3, now=NOW)
    next_step = app.signature("gone.next", args=(), options={"task_id": "n1"})
    app.send_task(
        "gone.task",
        args=(1, "two"),
        kwargs={"three": 3},
        task_id="t-unknown",
        root_id="root-9",
        parent_id="p-1",
        chain=[dict(next_step)],
        queue=queue_name,
    )
    (message,) = queued_messages(queue_name)
    worker = Consumer(app)

    task_unknown.send(
        sender=worker, message=message, exc=KeyError("gone.task"), name="gone.task", id="t-unknown"
    )

    (letter,) = store.letters.values()
    assert (letter.task_name, letter.args, letter.kwargs) == ("gone.task", [1, "two"], {"three": 3})
    assert letter.exception_type == "celery.exceptions.NotRegistered"
    assert "'gone.task' is not registered on w1@host" in letter.exception_message
    assert letter.options["queue"] == queue_name
    assert letter.options["canvas"]["root_id"] == "root-9"
    assert letter.options["canvas"]["chain"][0]["task"] == "gone.next"
    found = store.get_workflow("root-9")
    assert found is not None
    assert (found.status, found.failed_task_id) == ("failed", "t-unknown")

    # once the task is deployed, its requeue resumes the workflow where it stopped
    app.task(name="gone.task", shared=False)(deployed)
    requeue(app, letter.id)
    found = store.get_workflow("root-9")
    assert found is not None
    assert found.status == "running"


def deployed(*args: object, **kwargs: object) -> None:
    """The task, deployed at last."""


def test_an_app_without_an_outbox_store_is_left_to_celery(app: Celery, queue_name: str) -> None:
    app.send_task("gone.task", args=(1,), queue=queue_name)
    (message,) = queued_messages(queue_name)
    worker = Consumer(app)
    assert dead_letter_unknown(worker, message, name="gone.task", id="x") is None
