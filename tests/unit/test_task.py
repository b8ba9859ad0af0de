"""``OutboxTask`` (:mod:`celery_outbox.task`): dispatch writes a row in the caller's
transaction and publishes it on commit; bad options are
refused at dispatch and when a worker starts.

Over the in-memory store and broker; the retries of a running task are in
``tests/unit/worker``, real databases and workers in ``tests/integration`` and
``tests/django``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from kombu import Connection, Queue

from celery_outbox import OutboxConfigError, OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.state import reset
from celery_outbox.store.records import MessageStatus
from celery_outbox.task import TaskOptionsCheck, check_app
from celery_outbox.testing import InMemoryOutboxStore

TASK = "unit.task.add"
ran: list[tuple[int, int]] = []


def add(a: int, b: int = 0) -> int:
    """A task body that records its call."""
    ran.append((a, b))
    return a + b


@pytest.fixture
def store() -> InMemoryOutboxStore:
    return InMemoryOutboxStore()


@pytest.fixture
def app(queue_name: str, store: InMemoryOutboxStore) -> Iterator[Celery]:
    app = Celery("task-unit", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = queue_name
    app.task(base=OutboxTask, name=TASK, shared=False)(add)
    install_store(app, store)
    ran.clear()
    yield app
    reset(app)
    app.close()


def make_task(app: Celery, name: str = "opts.x", **attrs: Any) -> OutboxTask:
    app.task(base=OutboxTask, name=name, shared=False, **attrs)(add)
    task: OutboxTask = app.tasks[name]  # the task itself, not a lazy proxy
    return task


def queued(queue_name: str) -> list[str]:
    with Connection("memory://") as conn:
        queue = Queue(queue_name)(conn.default_channel)
        ids = []
        while (message := queue.get(no_ack=True)) is not None:
            ids.append(message.headers["id"])
        return ids


def dispatch_then_fail(store: InMemoryOutboxStore, task: Any, *args: int) -> None:
    with store.atomic():
        task.delay(*args)
        raise RuntimeError("rollback")


def rows(store: InMemoryOutboxStore) -> list[tuple[str, MessageStatus]]:
    return [(r.task_id, r.status) for r in store.rows.values()]


# -- dispatch ---------------------------------------------------------------------------
def test_dispatch_writes_a_row_and_publishes_it_after_commit(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    with store.atomic():
        result = app.tasks[TASK].delay(1, b=2)
        assert rows(store) == [(result.id, MessageStatus.PENDING)]
        assert queued(queue_name) == []  # not before the commit

    assert queued(queue_name) == [result.id]
    assert store.rows == {}  # published rows are deleted (no retention)


def test_a_rolled_back_dispatch_leaves_neither_row_nor_message(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    with pytest.raises(RuntimeError, match="rollback"):
        dispatch_then_fail(store, app.tasks[TASK], 1)

    assert (rows(store), queued(queue_name)) == ([], [])


def test_a_task_id_is_an_idempotency_key_while_its_row_is_pending(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    task = app.tasks[TASK]
    with store.atomic():
        first = task.apply_async((1,), task_id="order-7")
        second = task.apply_async((2,), task_id="order-7")
        assert len(store.rows) == 1

    assert first.id == second.id == "order-7"
    assert queued(queue_name) == ["order-7"]


def test_a_later_replacement_generation_supersedes_the_pending_row(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    # Celery's Task.replace() sends its replacement under the replaced task's id, one
    # generation up; a second send of that same generation is still swallowed.
    task = app.tasks[TASK]
    with store.atomic():
        task.apply_async((1,), task_id="replaced")
        task.apply_async((2,), task_id="replaced", replaced_task_nesting=1)
        task.apply_async((3,), task_id="replaced", replaced_task_nesting=1)
        ((only),) = store.rows.values()
        assert only.payload.startswith("[[2]")

    assert queued(queue_name) == ["replaced"]


def test_apply_async_returns_the_result_celery_built(app: Celery) -> None:
    quiet = make_task(app, "unit.task.quiet", ignore_result=True)

    assert quiet.delay(1).ignored is True
    assert app.tasks[TASK].delay(1).ignored is False


def test_the_on_commit_variants_are_the_same_dispatch(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    task = app.tasks[TASK]
    with store.atomic():
        one = task.delay_on_commit(1)
        two = task.apply_async_on_commit((2,), countdown=0)
        assert len(store.rows) == 2

    assert queued(queue_name) == [one.id, two.id]


def test_a_task_with_bad_options_is_refused_at_dispatch(
    app: Celery, store: InMemoryOutboxStore
) -> None:
    bad = make_task(app, max_retries="3")

    with pytest.raises(OutboxConfigError, match="max_retries='3'"):
        bad.delay(1)
    assert store.rows == {}


def test_called_directly_it_runs_like_a_function(app: Celery, store: InMemoryOutboxStore) -> None:
    assert app.tasks[TASK](2, b=3) == 5
    assert ran == [(2, 3)]
    assert store.rows == {}


# -- checks when a worker starts -------------------------------------------------------------
def test_check_app_lists_every_bad_task() -> None:
    app = Celery("t", set_as_current=False)
    make_task(app, "opts.good")
    make_task(app, "opts.one", max_retries="3")
    make_task(app, "opts.two", autoretry_for=("ProviderError",))
    with pytest.raises(OutboxConfigError) as caught:
        check_app(app)
    assert "'opts.one'" in str(caught.value)
    assert "'opts.two'" in str(caught.value)
    assert "opts.good" not in str(caught.value)


def test_check_app_reports_bad_options_and_atomic_tasks_it_cannot_run_together() -> None:
    app = Celery("t", set_as_current=False)

    class NoAtomic(InMemoryOutboxStore):
        def atomic_problem(self, using: str | None = None) -> str | None:
            return "not here"

    install_store(app, NoAtomic())
    make_task(app, "opts.bad", max_retries="3")
    make_task(app, "opts.atomic", atomic=True)
    with pytest.raises(OutboxConfigError) as caught:
        check_app(app)
    assert "'opts.bad'" in str(caught.value)
    assert "Task 'opts.atomic' is atomic, but cannot run on database 'default'" in str(caught.value)


def test_binding_an_outbox_task_adds_the_worker_check() -> None:
    app = Celery("t", set_as_current=False)
    make_task(app)
    app.finalize()
    assert TaskOptionsCheck in app.steps["worker"]


def test_check_app_checks_the_outbox_settings_too() -> None:
    app = Celery("t", set_as_current=False)
    app.conf.outbox_park_after = "30"
    with pytest.raises(OutboxConfigError, match="outbox_park_after='30'"):
        check_app(app)
