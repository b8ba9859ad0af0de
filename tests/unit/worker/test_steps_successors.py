"""An atomic step's link callbacks and next chain step are outbox rows of its own
transaction, and Celery's tracer is left nothing to send again.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, Task, group
from celery.exceptions import Retry

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.testing import InMemoryOutboxStore
from tests.unit.worker.support import deliver, queued_messages, queued_tasks


@pytest.fixture
def app(queue_name: str) -> Iterator[Celery]:
    app = Celery("successors-unit", broker="memory://", set_as_current=False)
    app.conf.update(task_default_queue=queue_name, task_inherit_parent_priority=True)
    yield app
    app.close()


@pytest.fixture
def store(app: Celery) -> InMemoryOutboxStore:
    store = InMemoryOutboxStore()
    install_store(app, store)
    return store


@pytest.fixture
def tasks(app: Celery, store: InMemoryOutboxStore) -> dict[str, Task[Any, Any]]:
    @app.task(base=OutboxTask, name="succ.step", shared=False, atomic=True, max_retries=1)
    def step(value: int, fail: bool = False) -> int:
        if fail:
            raise ValueError("the step failed")
        return value + 1

    @app.task(base=OutboxTask, name="succ.plain_outbox", shared=False)
    def plain_outbox(value: int) -> None: ...

    @app.task(name="succ.celery", shared=False)
    def celery_task(value: int) -> None: ...

    return {"step": step, "outbox": plain_outbox, "celery": celery_task}


def run_step(
    task: Task[Any, Any], *, queue: str, chain: list[Any], callbacks: list[Any], **kwargs: Any
) -> tuple[Any, Any]:
    """Deliver ``step(1)``; return its value and the request as the tracer sees it after."""
    seen: dict[str, Any] = {}
    original = task.pop_request

    def keep_request() -> None:
        seen["request"] = task.request
        original()

    task.pop_request = keep_request  # type: ignore[method-assign]
    try:
        value = deliver(task, 1, queue=queue, chain=chain, callbacks=callbacks, **kwargs)
    finally:
        del task.pop_request
    return value, seen["request"]


def test_the_next_step_and_links_are_dispatched_with_the_steps_commit(
    tasks: dict[str, Task[Any, Any]], queue_name: str, store: InMemoryOutboxStore
) -> None:
    step, following = tasks["step"], tasks["outbox"]
    later = dict(step.s())
    value, request = run_step(
        step,
        queue=queue_name,
        chain=[later, dict(step.s())],
        callbacks=[dict(following.s())],
        delivery_info={"exchange": "", "routing_key": queue_name, "priority": 3},
    )
    assert value == 2
    messages = queued_messages(queue_name)
    sent = [(m.headers["task"], tuple(m.decode()[0])) for m in messages]
    assert sorted(sent) == [("succ.plain_outbox", (2,)), ("succ.step", (2,))]
    assert [m.properties["priority"] for m in messages] == [3, 3]  # the parent's, as in Celery
    assert (request.chain, request.callbacks) == (None, None)  # the tracer sends nothing
    assert store.completion("t1") is not None


def test_the_rest_of_the_chain_travels_with_the_next_step(
    tasks: dict[str, Task[Any, Any]], queue_name: str
) -> None:
    step = tasks["step"]
    last, middle = dict(step.s()), dict(step.s())
    run_step(step, queue=queue_name, chain=[last, middle], callbacks=[])
    (message,) = queued_messages(queue_name)
    _args, _kwargs, embed = message.decode()
    assert [s["task"] for s in embed["chain"]] == ["succ.step"]
    assert message.headers["parent_id"] == "t1"


def test_a_failed_step_dispatches_nothing(
    tasks: dict[str, Task[Any, Any]], queue_name: str
) -> None:
    step = tasks["step"]
    with pytest.raises(Retry):
        deliver(
            step,
            1,
            True,
            queue=queue_name,
            chain=[dict(step.s())],
            callbacks=[dict(tasks["outbox"].s())],
        )
    assert [name for name, _args in queued_tasks(queue_name)] == ["succ.step"]  # its retry


@pytest.mark.parametrize("kind", ["celery", "group with a celery task"])
def test_successors_with_any_task_that_is_not_an_outbox_task_are_left_to_celery(
    tasks: dict[str, Task[Any, Any]], queue_name: str, kind: str
) -> None:
    other = (
        dict(tasks["celery"].s())
        if kind == "celery"
        else dict(group(tasks["outbox"].s(), tasks["celery"].s()))
    )
    _value, request = run_step(
        tasks["step"], queue=queue_name, chain=[], callbacks=[dict(tasks["outbox"].s()), other]
    )
    assert queued_tasks(queue_name) == []  # none sent here: all of them left to Celery
    assert len(request.callbacks) == 2


def test_a_group_of_outbox_tasks_is_dispatched_with_the_steps_commit(
    tasks: dict[str, Task[Any, Any]], queue_name: str
) -> None:
    members = dict(group(tasks["outbox"].s(), tasks["outbox"].s()))
    _value, request = run_step(tasks["step"], queue=queue_name, chain=[members], callbacks=[])
    assert queued_tasks(queue_name) == [("succ.plain_outbox", (2,)), ("succ.plain_outbox", (2,))]
    assert request.chain is None  # the tracer has nothing left to send
