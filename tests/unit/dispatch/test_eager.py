"""``OutboxTask`` under ``task_always_eager`` (:mod:`celery_outbox.dispatch.eager`): the task
runs when the caller's transaction commits, never after a rollback, and its arguments
are checked at the call as a real dispatch checks them.
"""

from __future__ import annotations

import pytest
from celery import Celery

from celery_outbox import PayloadError
from celery_outbox.testing import InMemoryOutboxStore
from tests.unit.test_task import TASK, app, dispatch_then_fail, queued, ran, rows, store

__all__ = ["app", "store"]  # the fixtures of tests/unit/test_task.py


def test_eager_mode_runs_the_task_on_commit_and_never_on_rollback(
    app: Celery, store: InMemoryOutboxStore, queue_name: str
) -> None:
    app.conf.task_always_eager = True
    task = app.tasks[TASK]

    with store.atomic():
        task.delay(1, b=1)
        assert ran == []
    with pytest.raises(RuntimeError, match="rollback"):
        dispatch_then_fail(store, task, 9)

    assert ran == [(1, 1)]
    assert (rows(store), queued(queue_name)) == ([], [])


def test_eager_mode_outside_a_transaction_returns_the_result(app: Celery) -> None:
    app.conf.task_always_eager = True
    assert app.tasks[TASK].delay(2, b=3).get() == 5


def test_eager_mode_checks_the_arguments_at_the_call(app: Celery) -> None:
    app.conf.task_always_eager = True
    nested: object = 0
    for _ in range(101):
        nested = [nested]

    with pytest.raises(PayloadError, match="MAX_ARGUMENT_DEPTH"):
        app.tasks[TASK].delay(nested)
    with pytest.raises(PayloadError):
        app.tasks[TASK].delay(object())
    assert ran == []
