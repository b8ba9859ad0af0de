"""The development warning for canvases with steps that are not atomic ``OutboxTask`` s
(:mod:`celery_outbox.workflows.checks`), through real dispatches on the in-memory store.
"""

from __future__ import annotations

import warnings
from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery, chain

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.state import reset
from celery_outbox.testing import InMemoryOutboxStore
from celery_outbox.workflows import checks as canvas_warnings
from celery_outbox.workflows.checks import NonDurableStepWarning


def body(*args: Any) -> None:
    """A task body."""


@pytest.fixture
def app(queue_name: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Celery]:
    monkeypatch.setattr(canvas_warnings, "_warned", set())
    monkeypatch.setattr(canvas_warnings, "_enabled", lambda: True)
    app = Celery("canvas-warnings", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = queue_name
    app.task(base=OutboxTask, name="cw.atomic", shared=False, atomic=True)(body)
    app.task(base=OutboxTask, name="cw.loose", shared=False)(body)
    app.task(name="cw.plain", shared=False)(body)
    install_store(app, InMemoryOutboxStore())
    yield app
    reset(app)
    app.close()


def dispatch(app: Celery, *names: str) -> list[str]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        chain(*(app.tasks[f"cw.{name}"].s() for name in names)).apply_async()
    return [str(w.message) for w in caught if issubclass(w.category, NonDurableStepWarning)]


def test_a_canvas_with_loose_or_plain_steps_warns_once_per_shape(app: Celery) -> None:
    (message,) = dispatch(app, "atomic", "loose", "plain")
    assert "cw.loose (not atomic: run at least once)" in message
    assert "cw.plain (not OutboxTasks: Celery's own behaviour)" in message
    assert "cw.atomic → cw.loose → cw.plain" in message
    assert dispatch(app, "atomic", "loose", "plain") == []  # the same shape: once
    assert len(dispatch(app, "atomic", "loose")) == 1  # another shape


def test_an_all_atomic_canvas_never_warns(app: Celery) -> None:
    assert dispatch(app, "atomic", "atomic", "atomic") == []


def test_nothing_is_said_unless_enabled(app: Celery) -> None:
    canvas_warnings.enable(lambda: False)
    try:
        assert dispatch(app, "atomic", "loose") == []
    finally:
        canvas_warnings.enable(lambda: True)
