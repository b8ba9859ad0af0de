"""Fixtures of the worker unit tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from celery import Celery

from celery_outbox import OutboxTask
from tests.unit.worker.support import TASK


def task_body(n: int) -> int:
    """A task body."""
    return n


@pytest.fixture
def app(queue_name: str) -> Iterator[Celery]:
    """A memory-broker app with one outbox task (``TASK``), parking waits over 30 s."""
    app = Celery("worker-unit", broker="memory://", set_as_current=False)
    app.conf.update(task_default_queue=queue_name, outbox_park_after=30.0)
    app.task(base=OutboxTask, name=TASK, shared=False)(task_body)
    yield app
    app.close()
