"""Which dispatches an atomic step offers its store to write with its last writes
(``CompletionStore.hand_on``, :func:`celery_outbox.workflows.dispatch.hand_on`): its next
chain step, dispatched as it ends, with nothing to count and no one told the row id
before the commit. Its body's dispatches, its link callbacks (counted at dispatch) and
any dispatch while a ``task_dispatched`` receiver listens are added as before.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import Any

import pytest
from celery import Celery, Task
from celery._state import _task_stack

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.signals import task_dispatched
from celery_outbox.store.records import NewMessage, StoredMessage
from celery_outbox.testing import InMemoryOutboxStore
from tests.unit.worker.support import deliver as deliver_one
from tests.unit.worker.support import queued_messages


class HandingStore(InMemoryOutboxStore):
    """Takes what it is offered (as ``add`` then ``defer_publish``), noting the task ids."""

    def __init__(self) -> None:
        super().__init__()
        self.handed: list[str] = []

    def hand_on(
        self,
        message: NewMessage,
        publish: Callable[[Sequence[StoredMessage]], object],
        *,
        using: str | None = None,
    ) -> bool:
        self.handed.append(message.task_id)
        row_id = self.add(message, using=using)
        if row_id is not None:
            self.defer_publish(StoredMessage.written(message, row_id), publish, using=using)
        return True


@pytest.fixture
def app(queue_name: str) -> Iterator[Celery]:
    app = Celery("hand-on-unit", broker="memory://", set_as_current=False)
    app.conf.update(task_default_queue=queue_name)
    yield app
    app.close()


@pytest.fixture
def store(app: Celery) -> HandingStore:
    store = HandingStore()
    install_store(app, store)
    return store


@pytest.fixture
def tasks(app: Celery, store: HandingStore) -> dict[str, Task[Any, Any]]:
    @app.task(base=OutboxTask, name="hand.step", shared=False, atomic=True)
    def step(value: int) -> int:
        return value + 1

    @app.task(base=OutboxTask, name="hand.loose", shared=False)
    def loose(value: int) -> None: ...

    @app.task(base=OutboxTask, name="hand.starter", shared=False, atomic=True)
    def starter(value: int) -> int:
        loose.delay(value)
        return value

    return {"step": step, "loose": loose, "starter": starter}


def deliver(task: Task[Any, Any], *args: Any, **request: Any) -> Any:
    """One delivery, ``task`` the current worker task as the worker's tracer makes it."""
    _task_stack.push(task)
    try:
        return deliver_one(task, *args, **request)
    finally:
        _task_stack.pop()


def frozen(task: Task[Any, Any]) -> dict[str, Any]:
    """A signature with its task id, as a chain's steps travel."""
    sig = task.s()
    sig.freeze()
    return dict(sig)


def test_the_next_chain_step_is_handed_on(
    tasks: dict[str, Task[Any, Any]], store: HandingStore, queue_name: str
) -> None:
    following = frozen(tasks["step"])
    deliver(tasks["step"], 1, queue=queue_name, chain=[following])

    assert store.handed == [following["options"]["task_id"]]
    (message,) = queued_messages(queue_name)
    assert message.headers["id"] == following["options"]["task_id"]


def test_a_link_callback_is_added(
    tasks: dict[str, Task[Any, Any]], store: HandingStore, queue_name: str
) -> None:
    deliver(tasks["step"], 1, queue=queue_name, chain=[], callbacks=[frozen(tasks["loose"])])

    assert store.handed == []
    assert len(queued_messages(queue_name)) == 1


def test_the_bodys_dispatches_are_added(
    tasks: dict[str, Task[Any, Any]], store: HandingStore, queue_name: str
) -> None:
    deliver(tasks["starter"], 1, queue=queue_name)

    assert store.handed == []
    assert len(queued_messages(queue_name)) == 1


def test_nothing_is_handed_on_while_someone_listens_for_row_ids(
    tasks: dict[str, Task[Any, Any]], store: HandingStore, queue_name: str
) -> None:
    seen: list[Any] = []

    def listen(sender: Any, **kwargs: Any) -> None:
        seen.append(kwargs["row_id"])

    task_dispatched.connect(listen, weak=False)
    try:
        deliver(tasks["step"], 1, queue=queue_name, chain=[frozen(tasks["step"])])
    finally:
        task_dispatched.disconnect(listen)

    assert store.handed == []
    assert len(seen) == 1
    assert seen[0] is not None
    assert len(queued_messages(queue_name)) == 1
