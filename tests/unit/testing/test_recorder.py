"""``OutboxRecorder`` (:mod:`celery_outbox.testing.recorder`), the ``outbox`` fixture's object, over
the in-memory store and broker: what it records, its assertions, and ``drain()``.

The same promises on PostgreSQL (Django and SQLAlchemy stores) and a real broker are in
``tests/django/test_pytest_plugin.py`` and ``tests/integration/test_pytest_plugin_sqlalchemy.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.state import reset
from celery_outbox.testing import InMemoryOutboxStore, recorder
from celery_outbox.testing.recorder import DispatchState, Drained, OutboxRecorder
from tests.unit.test_task import TASK, add, app, queued, ran, store

__all__ = ["app", "store"]  # the fixtures of tests/unit/test_task.py

CHAIN = "unit.recorder.then_add"
FAIL = "unit.recorder.fail"


@pytest.fixture
def outbox(app: Celery) -> Iterator[OutboxRecorder]:
    app.task(base=OutboxTask, name=CHAIN, shared=False)(then_add)
    app.task(base=OutboxTask, name=FAIL, shared=False)(fail)
    with OutboxRecorder.recording(app) as recording:
        yield recording


def then_add(a: int) -> None:
    """Dispatch ``add(a, b=1)`` (a follow-up for drain() to find)."""
    ran.append((a, -1))
    from celery import current_task

    current_task.app.tasks[TASK].delay(a, b=1)


def fail() -> None:
    raise ValueError("task body failed")


def rolled_back(store: InMemoryOutboxStore, work: Any) -> None:
    with pytest.raises(RuntimeError, match="rollback"):
        dispatch_then_fail(store, work)


def dispatch_then_fail(store: InMemoryOutboxStore, work: Any) -> None:
    with store.atomic():
        work()
        raise RuntimeError("rollback")


# -- what is recorded ----------------------------------------------------------------------------
def test_it_records_each_dispatch_with_its_call_options_and_alias(
    app: Celery, outbox: OutboxRecorder
) -> None:
    result = app.tasks[TASK].apply_async((1,), {"b": 2}, queue="mail", countdown=5, using="x")

    [dispatch] = outbox.dispatches
    assert (dispatch.task_name, dispatch.task_id) == (TASK, result.id)
    assert (dispatch.args, dispatch.kwargs, dispatch.using) == ((1,), {"b": 2}, "x")
    assert dispatch.options == {"queue": "mail", "countdown": 5}
    assert dispatch.row_id is not None
    assert dispatch.message is not None


def test_the_state_follows_the_transaction(
    app: Celery, store: InMemoryOutboxStore, outbox: OutboxRecorder
) -> None:
    task = app.tasks[TASK]
    with store.atomic():
        task.delay(1)
    rolled_back(store, lambda: task.delay(2))
    with store.atomic():
        task.delay(3)
        states = [d.state for d in outbox.dispatches]

    assert states == [
        DispatchState.COMMITTED,
        DispatchState.ROLLED_BACK,
        DispatchState.AWAITING_COMMIT,
    ]
    assert outbox.dispatches[2].state is DispatchState.COMMITTED


def test_nothing_is_published_while_recording_and_publishing_resumes_after(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    with OutboxRecorder.recording(app), store.atomic():
        app.tasks[TASK].delay(1)
    assert queued(queue_name) == []
    assert len(store.rows) == 1  # pending, for drain()

    later = app.tasks[TASK].delay(2)
    assert queued(queue_name) == [later.id]


def test_a_duplicate_and_an_eager_dispatch_are_recorded_without_a_row(
    app: Celery, outbox: OutboxRecorder
) -> None:
    task = app.tasks[TASK]
    task.apply_async((1,), task_id="same")
    task.apply_async((2,), task_id="same")
    app.conf.task_always_eager = True
    task.delay(3)

    first, duplicate, eager = outbox.dispatches
    assert (first.duplicate, duplicate.duplicate, eager.eager) == (False, True, True)
    assert (duplicate.row_id, eager.row_id) == (None, None)
    assert outbox.sent(TASK) == [first, eager]  # the duplicate wrote nothing
    assert ran == [(3, 0)]


def test_clear_forgets_the_dispatches(app: Celery, outbox: OutboxRecorder) -> None:
    app.tasks[TASK].delay(1)
    outbox.clear()
    assert outbox.dispatches == []
    outbox.assert_not_sent()


# -- assertions ----------------------------------------------------------------------------------
def test_assert_sent_matches_task_arguments_alias_and_options(
    app: Celery, outbox: OutboxRecorder
) -> None:
    task = app.tasks[TASK]
    task.apply_async((1,), {"b": 2}, queue="mail", using="other")
    task.delay(5)
    task.delay(5)

    found = outbox.assert_sent(task, args=[1], kwargs={"b": 2}, using="other")
    assert found is outbox.dispatches[0]
    assert outbox.assert_sent(TASK, options={"queue": "mail"}).args == (1,)
    outbox.assert_sent(TASK, args=(5,), count=2)
    outbox.assert_sent(TASK, args=(5,), using=None, count=2)
    with pytest.raises(AssertionError, match=r"add\(5, \*\*any\), found 2\.\n"):
        outbox.assert_sent(TASK, args=(5,))
    with pytest.raises(ValueError, match="count=0"):
        outbox.assert_sent(TASK, count=0)


def test_rolled_back_dispatches_only_match_when_asked_for(
    app: Celery, store: InMemoryOutboxStore, outbox: OutboxRecorder
) -> None:
    rolled_back(store, lambda: app.tasks[TASK].delay(1))

    with pytest.raises(AssertionError, match="rolled back: its transaction did not commit"):
        outbox.assert_sent(TASK)
    outbox.assert_sent(TASK, rolled_back=True)
    assert outbox.sent(rolled_back=True) == outbox.dispatches
    assert outbox.sent() == []
    outbox.assert_not_sent(TASK)
    outbox.assert_not_sent()


def test_assert_not_sent_names_what_was_found(app: Celery, outbox: OutboxRecorder) -> None:
    app.tasks[TASK].delay(1)
    outbox.assert_not_sent(TASK, args=(2,))

    with pytest.raises(AssertionError, match=r"Expected no outbox dispatch, found 1:\n  - "):
        outbox.assert_not_sent()
    with pytest.raises(AssertionError, match=r"\(1\)  \[committed.*<- matches"):
        outbox.assert_not_sent(TASK, args=(1,))


# -- drain ---------------------------------------------------------------------------------------
def test_drain_runs_the_kept_dispatches_in_order_and_what_they_dispatch(
    app: Celery, store: InMemoryOutboxStore, outbox: OutboxRecorder, queue_name: str
) -> None:
    with store.atomic():
        app.tasks[TASK].delay(1)
        app.tasks[CHAIN].apply_async((2,), countdown=3600)  # parked: drained all the same
    rolled_back(store, lambda: app.tasks[TASK].delay(9))

    drained = outbox.drain()

    assert ran == [(1, 0), (2, -1), (2, 1)]
    assert [d.drained for d in drained] == [Drained.RAN] * 3
    assert (store.rows, queued(queue_name)) == ({}, [])
    assert outbox.drain() == []


def test_drain_runs_what_the_test_transaction_kept_before_it_commits(
    app: Celery, store: InMemoryOutboxStore, outbox: OutboxRecorder
) -> None:
    with store.atomic():  # as pytest-django's django_db wraps a test
        app.tasks[TASK].delay(1)
        rolled_back(store, lambda: app.tasks[TASK].delay(2))
        outbox.drain()
        assert ran == [(1, 0)]


def test_drain_publish_sends_the_rows_to_the_broker(
    app: Celery, store: InMemoryOutboxStore, outbox: OutboxRecorder, queue_name: str
) -> None:
    first = app.tasks[TASK].delay(1)
    second = app.tasks[TASK].apply_async((2,), countdown=3600)

    drained = outbox.drain(publish=True)

    assert [d.drained for d in drained] == [Drained.PUBLISHED] * 2
    assert queued(queue_name) == [first.id, second.id]
    assert (store.rows, ran) == ({}, [])


def test_a_task_failure_propagates_out_of_drain(app: Celery, outbox: OutboxRecorder) -> None:
    app.tasks[FAIL].delay()
    with pytest.raises(ValueError, match="task body failed"):
        outbox.drain()


def test_drain_fails_naming_a_kept_dispatch_whose_row_is_gone(
    app: Celery, store: InMemoryOutboxStore, outbox: OutboxRecorder
) -> None:
    app.tasks[TASK].delay(7)
    store.rows.clear()  # as if a sweeper had published it

    with pytest.raises(AssertionError) as failure:
        outbox.drain()
    assert str(failure.value).startswith(
        "drain() found no pending outbox row for 1 kept dispatch(es):\n"
        f"  - {TASK}(7)  [committed, using=None, task_id="
    )
    assert "a sweeper, relay or worker published or deleted the row" in str(failure.value)


def test_drain_gives_up_on_tasks_that_keep_dispatching(
    app: Celery, outbox: OutboxRecorder, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(recorder, "MAX_DRAIN_ROUNDS", 2)
    app.tasks[CHAIN].delay(1)
    app.tasks[CHAIN].delay(2)  # a round of two, then one of two follow-ups: limit reached

    with pytest.raises(AssertionError, match=r"stopped after 2 rounds.*Last round: "):
        outbox.drain()


def test_drain_publish_fails_naming_the_rows_the_broker_did_not_get(
    app: Celery, store: InMemoryOutboxStore, outbox: OutboxRecorder, queue_name: str
) -> None:
    app.tasks[FAIL].delay()
    del app.tasks[FAIL]  # as in a worker that never imported the task's module

    with pytest.raises(AssertionError) as failure:
        outbox.drain(publish=True)
    assert str(failure.value).startswith(
        "drain(publish=True) could not publish 1 row(s) to the broker:\n"
        f"  - {FAIL}()  [committed, using=None, task_id="
    )
    assert FAIL in str(failure.value).split("]: ", 1)[1]  # the sweeper's reason names it
    assert queued(queue_name) == []


def test_another_apps_dispatch_is_held_from_its_first_row_and_drained_with_its_app(
    outbox: OutboxRecorder, queue_name: str
) -> None:
    other = Celery("recorder-other", broker="memory://", set_as_current=False)
    other.conf.task_default_queue = queue_name
    other_store = InMemoryOutboxStore()
    install_store(other, other_store)
    other.task(base=OutboxTask, name="unit.recorder.other", shared=False)(add)
    try:
        other.tasks["unit.recorder.other"].delay(4)
        assert (queued(queue_name), len(other_store.rows)) == ([], 1)

        outbox.drain()

        assert (ran, other_store.rows) == ([(4, 0)], {})
    finally:
        reset(other)
        other.close()
