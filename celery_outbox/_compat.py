"""Every Celery internal celery-outbox leans on, in one place.

``tests/unit/test_compat.py`` pins each one, so a Celery upgrade that changes them fails
there, by name, rather than somewhere in a worker. (kombu, py-amqp and redis-py internals
of the relay's connections live in :mod:`celery_outbox.broker`.)

- :func:`connect_on_app_finalize` / :func:`active_apps`: ``celery._state`` (how Celery
  registers its own ``celery.backend_cleanup`` task with every app). Finalize callbacks
  run *before* the app's pending task decorators are evaluated; ``app.on_after_finalize``
  is sent after.
- :func:`registered_tasks`: ``app._tasks``, the registry without the finalising that
  ``app.tasks`` does (safe inside a finalize callback).
- :data:`ORIG_RUN`: a task class defining this attribute is not wrapped by Celery's
  ``autoretry_for`` behaviour (``celery.app.autoretry``); ``OutboxTask`` sets it because
  it retries in ``__call__``.
- :func:`capture_message`: Celery's ``Task.apply_async`` run against a stand-in producer,
  to get the exact message Celery would publish without a broker, and the ``AsyncResult``
  Celery built for it (``ignored`` set, the result backend told of the call: the Redis
  backend subscribes to the task's channel then). It relies on Celery reading
  ``producer.serializer`` and ``producer.connection`` (only entering
  ``connection._reraise_as_library_errors()``) and calling ``producer.publish(body, **kw)``.
- :data:`REPLACED_TASK_NESTING`: the message header in which Celery counts how many times
  a task id was handed on by ``Task.replace()`` (0 for a first dispatch).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any, cast

from celery import Celery, Task
from celery import _state as celery_state
from celery.result import AsyncResult
from kombu import Connection

from celery_outbox.state import state_of

#: The attribute whose presence stops Celery wrapping ``run`` for ``autoretry_for``.
ORIG_RUN = "_orig_run"
#: Celery's message header counting the ``Task.replace()`` generations of a task id.
REPLACED_TASK_NESTING = "replaced_task_nesting"


def connect_on_app_finalize(callback: Callable[[Celery], Any]) -> Callable[[Celery], Any]:
    """Run ``callback(app)`` when any Celery app is finalised (before its pending tasks)."""
    return celery_state.connect_on_app_finalize(callback)


def active_apps() -> list[Celery]:
    """Every Celery app alive in this process."""
    return list(celery_state._get_active_apps())  # type: ignore[attr-defined]


def registered_tasks(app: Celery) -> dict[str, Task[Any, Any]]:
    """The tasks registered with ``app`` so far, without finalising it."""
    return cast(dict[str, Task[Any, Any]], app._tasks)  # type: ignore[attr-defined]


class _CapturingProducer:
    """Stands in for a kombu ``Producer``: keeps the message Celery built."""

    def __init__(self, connection: Connection) -> None:
        self.connection = connection
        self.serializer: str | None = None
        self.body: Any = None
        self.kwargs: dict[str, Any] = {}

    def publish(self, body: Any, **kwargs: Any) -> None:
        self.body, self.kwargs = body, kwargs


def _unconnected_connection(app: Celery) -> Connection:
    # Celery only enters ``connection._reraise_as_library_errors()``: nothing connects.
    state = state_of(app)
    if state.capture_connection is None:
        state.capture_connection = app.connection_for_write()
    return state.capture_connection


def capture_message(
    task: Task[Any, Any],
    args: Sequence[Any] | None,
    kwargs: Mapping[str, Any] | None,
    *,
    task_id: str,
    options: Mapping[str, Any],
) -> tuple[Any, dict[str, Any], AsyncResult[Any]]:
    """Run Celery's ``apply_async`` for ``task`` against a capturing producer.

    Returns the message body, the keyword arguments Celery would pass to
    ``Producer.publish``, and the ``AsyncResult`` Celery returns for the call.
    """
    producer = _CapturingProducer(_unconnected_connection(task.app))
    result = Task.apply_async(
        task,
        tuple(args or ()),
        dict(kwargs or {}),
        task_id=task_id,
        producer=cast(Any, producer),
        **options,
    )
    return producer.body, producer.kwargs, result


def successors(request: Any) -> tuple[list[Any], list[Any]]:
    """``(callbacks, chain)`` of the running request, as Celery's tracer will read them."""
    return list(request.callbacks or ()), list(request.chain or ())


def forget_successors(request: Any) -> None:
    """Make the tracer dispatch no callbacks and no next chain step for ``request``."""
    request.callbacks = None
    request.chain = None
