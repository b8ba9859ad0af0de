"""The Django ``Task`` of the outbox backend, and ``task()`` with the outbox's options.

Django's ``@task`` passes only ``priority``, ``queue_name``, ``backend`` and
``takes_context`` to the backend's ``task_class``. :func:`task` takes those and the retry
options of ``OutboxTask`` too; they are kept on the :class:`DurableTask` and become the
attributes of the Celery task the function runs as.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, overload

from django.tasks import DEFAULT_TASK_BACKEND_ALIAS, DEFAULT_TASK_QUEUE_NAME, task_backends
from django.tasks.base import DEFAULT_TASK_PRIORITY, Task
from django.tasks.exceptions import InvalidTask

from django_outbox.tasks.registry import register

if TYPE_CHECKING:
    _TaskBase = Task[..., Any]
else:  # django.tasks' Task is generic only in django-stubs
    _TaskBase = Task

#: "Not given": the ``OutboxTask`` default applies (``None`` is a value: no limit).
_UNSET: Any = object()


@dataclass(frozen=True, slots=True, kw_only=True)
class DurableTask(_TaskBase):
    """A Django task whose function runs on Celery as an ``OutboxTask``.

    ``outbox_options`` holds the ``OutboxTask`` attributes given to :func:`task`
    (``(name, value)`` pairs, so the task stays hashable); the others keep
    ``OutboxTask``'s defaults. Building one registers its Celery task (named after the
    function's module path) on every Celery app of the process, as ``shared_task`` does.
    """

    outbox_options: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self) -> None:
        Task.__post_init__(self)
        register(self, options=dict(self.outbox_options))


@overload
def task(function: Callable[..., Any], /) -> DurableTask: ...
@overload
def task(
    *,
    priority: int = ...,
    queue_name: str = ...,
    backend: str = ...,
    takes_context: bool = ...,
    max_retries: int | None = ...,
    retry_backoff: float | bool = ...,
    retry_backoff_max: float = ...,
    retry_max_elapsed: float | None = ...,
    autoretry_for: tuple[type[BaseException], ...] = ...,
    dont_autoretry_for: tuple[type[BaseException], ...] = ...,
    atomic: bool = ...,
    retry_queue: str | None = ...,
) -> Callable[[Callable[..., Any]], DurableTask]: ...
def task(
    function: Callable[..., Any] | None = None,
    /,
    *,
    priority: int = DEFAULT_TASK_PRIORITY,
    queue_name: str = DEFAULT_TASK_QUEUE_NAME,
    backend: str = DEFAULT_TASK_BACKEND_ALIAS,
    takes_context: bool = False,
    max_retries: int | None = _UNSET,
    retry_backoff: float | bool = _UNSET,
    retry_backoff_max: float = _UNSET,
    retry_max_elapsed: float | None = _UNSET,
    autoretry_for: tuple[type[BaseException], ...] = _UNSET,
    dont_autoretry_for: tuple[type[BaseException], ...] = _UNSET,
    atomic: bool = _UNSET,
    retry_queue: str | None = _UNSET,
) -> DurableTask | Callable[[Callable[..., Any]], DurableTask]:
    """Django's ``@task`` plus the retry options of ``OutboxTask``.

    ``@task`` or ``@task(max_retries=3, autoretry_for=(ApiDown,), atomic=True)``; the
    options keep Celery's names and units (seconds) and ``OutboxTask``'s defaults, and
    are checked as ``OutboxTask``'s are (at the first enqueue and when a worker starts).

    Raises
    ------
    InvalidTask
        When ``backend`` is not an outbox backend (its tasks could not hold the options),
        or the function cannot be a task of that backend (Django's validation).
    """
    given = {
        "max_retries": max_retries,
        "retry_backoff": retry_backoff,
        "retry_backoff_max": retry_backoff_max,
        "retry_max_elapsed": retry_max_elapsed,
        "autoretry_for": autoretry_for,
        "dont_autoretry_for": dont_autoretry_for,
        "atomic": atomic,
        "retry_queue": retry_queue,
    }
    # Lists of exceptions become tuples: the task stays hashable, and Celery wants tuples.
    options = tuple(
        (name, tuple(value) if isinstance(value, list) else value)
        for name, value in given.items()
        if value is not _UNSET
    )

    def wrapper(func: Callable[..., Any]) -> DurableTask:
        task_class = task_backends[backend].task_class
        if not (isinstance(task_class, type) and issubclass(task_class, DurableTask)):
            raise InvalidTask(
                f"Backend {backend!r} is not an outbox backend: django_outbox.tasks.task "
                "needs TASKS[...]['BACKEND'] = 'django_outbox.tasks.OutboxBackend' (or use "
                "django.tasks.task without the outbox options)."
            )
        made: DurableTask = task_class(
            priority=priority,
            func=func,
            queue_name=queue_name,
            backend=backend,
            takes_context=takes_context,
            run_after=None,
            outbox_options=options,
        )
        return made

    return wrapper(function) if function is not None else wrapper
