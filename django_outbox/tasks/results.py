"""``get_result``: a Django ``TaskResult`` read from Celery's result backend and the outbox.

Read in this order:

1. a dead letter of the id (any status): ``FAILED``, with its exception path and traceback;
2. the result backend (``result_extended`` gives the task's name, arguments and worker):
   ``PENDING`` written when the enqueue committed → ``READY``; ``STARTED`` → ``RUNNING``;
   ``RETRY`` → ``READY``; ``SUCCESS`` → ``SUCCESSFUL``; ``FAILURE`` and ``REVOKED`` →
   ``FAILED``;
3. nothing there (the backend's record expired, or the process died between COMMIT and
   writing it): a pending outbox row of the id → ``READY``; else the id is unknown.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any, Protocol

from celery import Celery, states
from django.tasks import TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.exceptions import TaskResultDoesNotExist
from django.utils.module_loading import import_string

from celery_outbox.dispatch.envelope import decode_body
from celery_outbox.store.records import MessageStatus
from django_outbox.models import DeadLetter, OutboxMessage
from django_outbox.tasks import statuses
from django_outbox.tasks.definition import DurableTask
from django_outbox.tasks.registry import definition_named


class ReadingBackend(Protocol):
    """What the reading needs of an ``OutboxBackend``."""

    @property
    def alias(self) -> str:
        """The backend's alias in ``TASKS``."""

    @property
    def database(self) -> str:
        """The database alias holding its outbox rows and dead letters."""


#: Celery states and the Django status each reads as.
STATUS_OF_STATE = {
    states.PENDING: statuses.READY,
    states.RECEIVED: statuses.READY,
    states.RETRY: statuses.READY,
    states.STARTED: statuses.RUNNING,
    states.SUCCESS: statuses.SUCCESSFUL,
    states.FAILURE: statuses.FAILED,
    states.REVOKED: statuses.FAILED,
}
#: The statuses with a ``finished_at``.
_FINISHED = frozenset({statuses.SUCCESSFUL, statuses.FAILED})


def read_result(backend: ReadingBackend, app: Celery, result_id: str) -> TaskResult[..., Any]:
    """The ``TaskResult`` of ``result_id``.

    Raises
    ------
    TaskResultDoesNotExist
        When neither a dead letter, the result backend nor the outbox knows the id, or
        it is the id of a task that is not a Django task.
    """
    letter = (
        DeadLetter.objects.using(backend.database)
        .filter(task_id=result_id)
        .order_by("-failed_at")
        .first()
    )
    if letter is not None:
        return _from_letter(backend, letter)
    meta = app.backend.get_task_meta(result_id)
    if meta.get("name"):
        return _from_meta(backend, app, result_id, meta)
    return _from_outbox(backend, app, result_id)


def _from_letter(backend: ReadingBackend, letter: DeadLetter) -> TaskResult[..., Any]:
    error = TaskError(exception_class_path=letter.exception_type, traceback=letter.traceback)
    return _result(
        backend,
        _definition(letter.task_name, letter.task_id),
        letter.task_id,
        statuses.FAILED,
        args=letter.args,
        kwargs=letter.kwargs,
        finished_at=letter.failed_at,
        errors=[error],
    )


def _from_meta(
    backend: ReadingBackend, app: Celery, result_id: str, meta: dict[str, Any]
) -> TaskResult[..., Any]:
    state = meta["status"]
    status = STATUS_OF_STATE.get(state, statuses.READY)
    errors = []
    if state in states.EXCEPTION_STATES:
        errors.append(_backend_error(meta))
    worker = meta.get("worker")
    attempts = int(meta.get("retries") or 0) + 1
    result = _result(
        backend,
        _definition(meta["name"], result_id),
        result_id,
        status,
        args=meta.get("args") or [],
        kwargs=meta.get("kwargs") or {},
        finished_at=_when(meta.get("date_done")) if status in _FINISHED else None,
        errors=errors,
        worker_ids=[str(worker)] * attempts if worker else [],
    )
    if status == statuses.SUCCESSFUL:
        object.__setattr__(result, "_return_value", meta.get("result"))
    return result


def _from_outbox(backend: ReadingBackend, app: Celery, result_id: str) -> TaskResult[..., Any]:
    row = (
        OutboxMessage.objects.using(backend.database)
        .filter(task_id=result_id, status=MessageStatus.PENDING.value)
        .first()
    )
    if row is None:
        raise TaskResultDoesNotExist(result_id)
    args, kwargs, _ = decode_body(
        row.payload, row.options, accept=app.conf.accept_content, max_bytes=None
    )
    return _result(
        backend,
        _definition(row.task_name, result_id),
        result_id,
        statuses.READY,
        args=args,
        kwargs=kwargs,
        enqueued_at=row.created_at,
    )


def _result(
    backend: ReadingBackend,
    definition: DurableTask,
    result_id: str,
    status: TaskResultStatus,
    **fields: Any,
) -> TaskResult[..., Any]:
    values: dict[str, Any] = {
        "enqueued_at": None,
        "started_at": None,
        "finished_at": None,
        "last_attempted_at": None,
        "errors": [],
        "worker_ids": [],
        **fields,
    }
    return TaskResult(task=definition, id=result_id, status=status, backend=backend.alias, **values)


def _definition(name: str, result_id: str) -> DurableTask:
    """The Django task registered as Celery task ``name``, importing its module if needed."""
    definition = definition_named(name)
    if definition is None:
        try:
            definition = import_string(name)
        except ImportError:
            definition = None
    if not isinstance(definition, DurableTask):
        raise TaskResultDoesNotExist(
            f"{result_id} is the id of {name!r}, which is not a task of a django_outbox "
            "tasks backend."
        )
    return definition


def _backend_error(meta: dict[str, Any]) -> TaskError:
    exc = meta.get("result")
    if isinstance(exc, dict):  # the serialised exception (exc_module, exc_type)
        path = f"{exc.get('exc_module')}.{exc.get('exc_type')}"
    else:
        kind = type(exc)
        path = f"{kind.__module__}.{kind.__qualname__}"
    return TaskError(exception_class_path=path, traceback=meta.get("traceback") or "")


def _when(value: datetime | str | None) -> datetime | None:
    if value is None or isinstance(value, datetime):
        return value
    return datetime.fromisoformat(value)
