"""A retried or failed ``OutboxTask``'s stack is freed when Celery's tracer returns, not at
the next full garbage collection (:mod:`celery_outbox.worker.runner`).

Run through Celery's own tracer (``build_tracer``, as a worker runs a task), with the
collector off so only reference counting frees anything. The plain task's case pins the
Celery behaviour the module exists for: if an upgrade stops keeping the retried stack in
a cycle, it fails, and the module can go.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, Task
from celery.app.trace import build_tracer
from celery.exceptions import Retry
from kombu.utils.uuid import uuid

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.state import reset
from celery_outbox.testing import InMemoryOutboxStore


@pytest.fixture
def app(queue_name: str) -> Iterator[Celery]:
    app = Celery("retry-frames", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = queue_name
    install_store(app, InMemoryOutboxStore())
    yield app
    reset(app)
    app.close()


@pytest.fixture
def collector_off() -> Iterator[None]:
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class Sentinel:
    """An object only the caller's frame refers to."""


def trace_once(app: Celery, task: Task[Any, Any], state: str = "RETRY") -> weakref.ref[Sentinel]:
    """Run ``task`` once through Celery's worker tracer, from a frame holding a
    :class:`Sentinel`: a weak reference to it, alive while that frame is kept.
    """

    def caller() -> weakref.ref[Sentinel]:
        sentinel = Sentinel()
        task_id = uuid()
        tracer = build_tracer(task.name, task, app=app, eager=False)
        request = {"id": task_id, "delivery_info": {"routing_key": "q"}, "retries": 0}
        _, info, _, _ = tracer(task_id, (1,), {}, request)
        assert info is not None
        assert info.state == state
        return weakref.ref(sentinel)

    return caller()


@pytest.mark.usefixtures("collector_off")
def test_an_outbox_tasks_retry_is_freed_when_the_tracer_returns(app: Celery) -> None:
    @app.task(bind=True, base=OutboxTask, name="frames.outbox", shared=False, max_retries=None)
    def park(self: OutboxTask, i: int) -> None:
        raise self.retry(countdown=3600)

    kept = trace_once(app, app.tasks["frames.outbox"])
    assert kept() is None


@pytest.mark.usefixtures("collector_off")
def test_a_failed_outbox_tasks_stack_is_freed_when_the_tracer_returns(app: Celery) -> None:
    @app.task(base=OutboxTask, name="frames.poison", shared=False, dont_autoretry_for=(KeyError,))
    def poison(i: int) -> None:
        raise KeyError(i)

    kept = trace_once(app, app.tasks["frames.poison"], state="FAILURE")
    assert kept() is None


@pytest.mark.usefixtures("collector_off")
def test_celerys_tracer_keeps_a_plain_tasks_retry_in_a_cycle(app: Celery) -> None:
    @app.task(bind=True, name="frames.plain", shared=False)
    def plain(self: Task[Any, Any], i: int) -> None:
        raise Retry("again", when=3600)

    kept = trace_once(app, app.tasks["frames.plain"])
    assert kept() is not None, (
        "Celery's tracer no longer keeps a retried task's stack in a reference cycle: "
        "celery_outbox.worker.runner may be unneeded"
    )
    gc.collect()
    assert kept() is None
