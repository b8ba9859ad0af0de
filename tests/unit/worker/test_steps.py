"""A workflow step on the worker (:mod:`celery_outbox.worker.steps`): chord header steps
counted in their join, the last one dispatching the body with the results in header
order, and steps counted done in their workflow; over the in-memory store and broker.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from celery import Celery, Task
from celery.exceptions import Ignore, Retry

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.testing import InMemoryOutboxStore
from celery_outbox.worker.steps import decode_part, encode_part
from celery_outbox.workflows.dispatch import JOIN_HEADER
from tests.unit.worker.support import deliver, queued_tasks

NOW = datetime(2026, 11, 27, tzinfo=UTC)


@pytest.fixture
def app(queue_name: str) -> Iterator[Celery]:
    app = Celery("steps-unit", broker="memory://", set_as_current=False)
    app.conf.update(task_default_queue=queue_name)
    yield app
    app.close()


@pytest.fixture
def store(app: Celery) -> InMemoryOutboxStore:
    store = InMemoryOutboxStore()
    install_store(app, store)
    return store


def double(value: int) -> int:
    """A header step."""
    return value * 2


def collect(results: list[int]) -> None:
    """A chord body."""


def idle(value: int) -> int:
    """A non-atomic step."""
    return value


@pytest.fixture
def tasks(app: Celery, store: InMemoryOutboxStore) -> dict[str, Task[Any, Any]]:
    atomic = {"base": OutboxTask, "shared": False, "atomic": True, "max_retries": 1}
    return {
        "double": app.task(name="steps.double", **atomic)(double),
        "collect": app.task(name="steps.collect", **atomic)(collect),
        "idle": app.task(name="steps.idle", base=OutboxTask, shared=False)(idle),
    }


def header_step(
    tasks: dict[str, Task[Any, Any]], queue: str, value: int, index: int, body: Any
) -> Any:
    return deliver(
        tasks["double"],
        value,
        task_id=f"h{index}",
        queue=queue,
        root_id="g1",
        group="g1",
        group_index=index,
        chord=body,
        outbox_join="g1",
        headers={JOIN_HEADER: "g1"},
    )


def test_the_last_header_step_dispatches_the_body_once_with_results_in_header_order(
    tasks: dict[str, Task[Any, Any]], store: InMemoryOutboxStore, queue_name: str
) -> None:
    body = dict(tasks["collect"].s().set(task_id="body-1"))
    store.add_workflow_steps("g1", name="chord", steps=4, now=NOW)
    store.open_join("g1", root_id="g1", size=3, now=NOW)

    header_step(tasks, queue_name, 30, 2, body)
    header_step(tasks, queue_name, 10, 0, body)
    assert queued_tasks(queue_name) == []  # the join is not complete
    header_step(tasks, queue_name, 20, 1, body)

    assert queued_tasks(queue_name) == [("steps.collect", ([20, 40, 60],))]
    found = store.get_workflow("g1")
    assert found is not None
    assert found.steps_done == 3
    assert [store.completion(f"h{i}").root_id for i in range(3)] == ["g1"] * 3  # type: ignore[union-attr]

    with pytest.raises(Ignore):
        header_step(tasks, queue_name, 20, 1, body)  # a duplicate delivery: skipped
    assert queued_tasks(queue_name) == []


def test_a_header_step_whose_join_is_missing_retries_naming_the_chord(
    tasks: dict[str, Task[Any, Any]], store: InMemoryOutboxStore, queue_name: str
) -> None:
    body = dict(tasks["collect"].s())
    with pytest.raises(Retry, match="Chord g1: its join row is missing"):
        header_step(tasks, queue_name, 1, 0, body)
    assert store.completion("h0") is None  # rolled back with the step


def test_a_non_atomic_step_counts_itself_done_after_it_returned(
    tasks: dict[str, Task[Any, Any]], store: InMemoryOutboxStore, queue_name: str
) -> None:
    store.add_workflow_steps("root-1", name="chain", steps=2, now=NOW)
    deliver(tasks["idle"], 5, task_id="s2", queue=queue_name, root_id="root-1")
    found = store.get_workflow("root-1")
    assert found is not None
    assert (found.steps_done, found.status) == (1, "running")
    deliver(tasks["idle"], 5, task_id="lone", queue=queue_name, root_id="lone")
    assert store.get_workflow("lone") is None  # a lone task is no step


@pytest.mark.parametrize("serializer", ["json", "pickle"])
def test_a_header_result_round_trips_through_its_join_with_the_tasks_serializer(
    tasks: dict[str, Task[Any, Any]], serializer: str
) -> None:
    task = tasks["double"]
    task.serializer = serializer
    try:
        value = {"a": [1, 2.5, "x"], "b": None}
        assert decode_part(encode_part(task, value)) == value
        assert encode_part(task, None) is None
        assert decode_part(None) is None
    finally:
        task.serializer = None  # type: ignore[assignment]
