"""How a Django task function runs inside its Celery task on a worker.

Each attempt builds the ``TaskResult`` Django's signals and ``TaskContext`` carry
(``RUNNING``, started now, one worker id per attempt so far), sends ``task_started``,
calls the function (a coroutine function through ``async_to_sync``), then sends
``task_finished`` with ``SUCCESSFUL`` or ``FAILED``. A failed attempt is then retried or
dead-lettered by ``OutboxTask`` around it, exactly as any outbox task: ``task_finished``
is sent once per attempt, and a ``FAILED`` one may be followed by a retry.
"""

from __future__ import annotations

from traceback import format_exception
from typing import TYPE_CHECKING, Any

from django.tasks import TaskContext, TaskResult, TaskResultStatus
from django.tasks.base import TaskError
from django.tasks.signals import task_finished, task_started
from django.utils import timezone
from django.utils.json import normalize_json

from django_outbox.tasks import statuses

if TYPE_CHECKING:
    from django.tasks.base import Task

    from celery_outbox import OutboxTask


def run_on_worker(
    definition: Task[..., Any], celery_task: OutboxTask, args: Any, kwargs: Any
) -> Any:
    """Run one attempt of ``definition`` as ``celery_task``'s body; its JSON return value."""
    result = running_result(definition, celery_task, args, kwargs)
    sender = type(definition.get_backend())  # as Django's backends: the backend's class
    task_started.send(sender=sender, task_result=result)
    try:
        if definition.takes_context:
            value = definition.call(TaskContext(task_result=result), *args, **kwargs)
        else:
            value = definition.call(*args, **kwargs)
        value = normalize_json(value)
    except KeyboardInterrupt:  # as Django's own backends: let the user stop it
        raise
    except BaseException as exc:
        _finish(result, statuses.FAILED, errors=[error_of(exc)])
        task_finished.send(sender=sender, task_result=result)  # in the handler: exc_info
        raise
    _finish(result, statuses.SUCCESSFUL, value=value)
    task_finished.send(sender=sender, task_result=result)
    return value


def running_result(
    definition: Task[..., Any], celery_task: OutboxTask, args: Any, kwargs: Any
) -> TaskResult[..., Any]:
    """The ``TaskResult`` of the attempt starting now on this worker."""
    request = celery_task.request
    now = timezone.now()
    attempts = int(request.retries or 0) + 1
    result = TaskResult(
        task=definition,
        id=str(request.id),
        status=statuses.RUNNING,
        enqueued_at=None,
        started_at=now,
        finished_at=None,
        last_attempted_at=now,
        args=list(args),
        kwargs=dict(kwargs),
        backend=definition.backend,
        errors=[],
        # Earlier attempts' workers are not recorded: this worker stands for each of them,
        # so that ``TaskContext.attempt`` (their count) is right.
        worker_ids=[str(request.hostname)] * attempts,
    )
    return result


def error_of(exc: BaseException) -> TaskError:
    """Django's ``TaskError`` for ``exc``: its class's dotted path and the traceback."""
    kind = type(exc)
    return TaskError(
        exception_class_path=f"{kind.__module__}.{kind.__qualname__}",
        traceback="".join(format_exception(exc)),
    )


def _finish(
    result: TaskResult[..., Any],
    status: TaskResultStatus,
    *,
    value: Any = None,
    errors: list[TaskError] | None = None,
) -> None:
    # TaskResult is frozen; Django's own backends update it this way too.
    object.__setattr__(result, "status", status)
    object.__setattr__(result, "finished_at", timezone.now())
    object.__setattr__(result, "_return_value", value)
    result.errors.extend(errors or ())
