"""Each Django task function becomes one Celery ``OutboxTask``, on every Celery app.

The Celery task is named after the function's module path (``proj.emails.send``) and
registered, as ``shared_task`` registers, on every app already alive and on every app
finalised later: a worker imports the module (Celery's ``autodiscover_tasks`` imports
``tasks.py`` of each installed app) and so knows the task. A message for a task whose
module the worker never imported becomes a dead letter (``celery_outbox.worker.letters``).
"""

from __future__ import annotations

import threading
from typing import TYPE_CHECKING, Any

from celery import Celery

from celery_outbox import OutboxTask
from celery_outbox._compat import active_apps, connect_on_app_finalize
from django_outbox.tasks.execution import run_on_worker

if TYPE_CHECKING:
    from django.tasks.base import Task

_definitions: dict[str, Task[..., Any]] = {}
_lock = threading.Lock()


def register(definition: Task[..., Any], *, options: dict[str, Any]) -> None:
    """Make ``definition``'s function a Celery task of every app, once per name (its
    module path), with ``options`` (``OutboxTask`` attributes).

    Copies made by ``Task.using()`` share the name and change nothing; a module
    reloaded replaces the definition the workers run.
    """
    name = definition.module_path
    with _lock:
        known = _definitions.get(name)
        if known is None or known.func is not definition.func:
            _definitions[name] = definition
    if known is not None:
        return
    make = _task_maker(name, options)
    connect_on_app_finalize(make)
    for app in active_apps():
        make(app)


def definition_named(name: str) -> Task[..., Any] | None:
    """The Django task registered as Celery task ``name`` in this process, if any."""
    return _definitions.get(name)


def _task_maker(name: str, options: dict[str, Any]) -> Any:
    def run(celery_task: OutboxTask, *args: Any, **kwargs: Any) -> Any:
        definition = _definitions[name]
        return run_on_worker(definition, celery_task, args, kwargs)

    run.__name__ = run.__qualname__ = name.rpartition(".")[2]
    run.__module__ = name.rpartition(".")[0]

    def make(app: Celery) -> Any:
        # track_started: a running task reads RUNNING through the result backend.
        make_task: Any = app.task  # celery-types' overloads know no OutboxTask option
        return make_task(
            run,
            name=name,
            base=OutboxTask,
            bind=True,
            shared=False,
            lazy=False,
            track_started=True,
            **options,
        )

    return make
