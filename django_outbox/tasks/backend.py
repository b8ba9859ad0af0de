"""``OutboxBackend``: Django's task backend on the outbox, and priorities.

Django's task priority (-100 … 100, higher runs first) as a Celery message priority.

The range is mapped linearly onto the broker's ten levels, 0 … 9, and rounded half up
(Django's default 0 is 5 on RabbitMQ). RabbitMQ runs higher numbers first (the queue
needs ``x-max-priority``); Redis runs *lower* numbers first (kombu reads its priority
lists 0, 3, 6, 9 in that order, and a message without a priority is 0), so on Redis the
scale is turned over: Django 100 → 0, Django 0 → 4, Django -100 → 9.

``OutboxBackend``: Django's task backend that writes outbox rows and runs on Celery.
"""

from __future__ import annotations

import math
from contextlib import suppress
from typing import Any, ParamSpec, TypeVar

from celery import Celery
from celery.app.task import Context
from celery.states import PENDING
from django.db import DEFAULT_DB_ALIAS, transaction
from django.tasks import DEFAULT_TASK_QUEUE_NAME, TaskResult
from django.tasks.backends.base import BaseTaskBackend
from django.tasks.base import TASK_MAX_PRIORITY, TASK_MIN_PRIORITY, Task
from django.tasks.exceptions import InvalidTask
from django.tasks.signals import task_enqueued
from django.utils import timezone
from kombu.utils.uuid import uuid

from celery_outbox import OutboxTask
from django_outbox.celery_app import import_app, project_app
from django_outbox.tasks import checks, results, statuses
from django_outbox.tasks.definition import DurableTask

# --- Django's task priority (-100 … 100, higher runs first) as a Celery message priority.

#: The highest Celery message priority (RabbitMQ's and kombu's Redis range is 0 … 9).
BROKER_MAX_PRIORITY = 9

#: Broker URL schemes whose transport runs lower priority numbers first.
LOW_FIRST_SCHEMES = frozenset({"redis", "rediss", "redis+socket", "sentinel"})


def broker_priority(priority: int, *, low_first: bool) -> int:
    """The Celery ``priority`` of a Django task of ``priority``.

    Parameters
    ----------
    priority
        Django's, -100 … 100 (validated by the backend before this is called).
    low_first
        Whether the broker runs lower numbers first (Redis).
    """
    span = TASK_MAX_PRIORITY - TASK_MIN_PRIORITY
    level = math.floor((priority - TASK_MIN_PRIORITY) * BROKER_MAX_PRIORITY / span + 0.5)
    return BROKER_MAX_PRIORITY - level if low_first else level


def runs_low_first(broker_url: str | None) -> bool:
    """Whether the broker of ``broker_url`` runs lower priority numbers first."""
    scheme = (broker_url or "amqp://").partition("://")[0].lower()
    return scheme in LOW_FIRST_SCHEMES


# --- ``OutboxBackend``: Django's task backend that writes outbox rows and runs on Celery.

_P = ParamSpec("_P")

_R = TypeVar("_R")


class OutboxBackend(BaseTaskBackend):
    """Enqueue Django tasks as outbox rows of the current transaction; run them on Celery.

    ``TASKS[alias]["OPTIONS"]``: ``DATABASE`` (the alias whose transaction the rows join,
    default ``"default"``) and ``CELERY_APP`` (dotted path of the Celery app; default
    ``DJANGO_OUTBOX_CELERY_APP``, else the app the project created). ``QUEUES`` lists the
    Celery queues tasks may name; Django's ``"default"`` queue is Celery's own routing
    (``task_routes``, then ``task_default_queue``).
    """

    task_class = DurableTask
    supports_defer = True
    supports_async_task = True
    supports_priority = True

    def __init__(self, alias: str, params: dict[str, Any]) -> None:
        super().__init__(alias, params)
        #: The database alias whose transaction :meth:`enqueue` writes in.
        self.database: str = self.options.get("DATABASE", DEFAULT_DB_ALIAS)
        self._app_path: str | None = self.options.get("CELERY_APP")
        self._app: Celery | None = None
        # Read from the app's configuration once: Celery's settings lookups are slow.
        self._results_readable: bool | None = None
        self._low_first: bool | None = None
        # Validated tasks without run_after (a bounded set: the module's tasks and their
        # using() copies), with their Celery task and options: enqueue() validates once.
        self._prepared: dict[Task[..., Any], tuple[OutboxTask, dict[str, Any]]] = {}

    @property
    def celery_app(self) -> Celery:
        """The Celery app the tasks are dispatched through (found once).

        Raises
        ------
        OutboxConfigError
            When ``OPTIONS["CELERY_APP"]`` does not import, or no Celery app exists.
        """
        if self._app is None:
            self._app = import_app(self._app_path) if self._app_path else project_app()
        return self._app

    @property
    def supports_get_result(self) -> bool:  # type: ignore[override]
        """Whether results can be read: a result backend, ``result_extended`` on, and
        results not ignored (see :func:`~django_outbox.tasks.checks.results_unreadable`);
        read from the Celery configuration at the first use.
        """
        if self._results_readable is None:
            self._results_readable = checks.results_unreadable(self) is None
        return self._results_readable

    def validate_task(self, task: Any) -> None:
        """Django's validation (module-level function, priority, ``run_after``, queue),
        and that ``task`` is a :class:`DurableTask` (it has a Celery task).
        """
        super().validate_task(task)
        if not isinstance(task, DurableTask):
            raise InvalidTask(
                f"{task!r} is a {type(task).__name__}, not a DurableTask: define it with "
                "@task while this backend is its backend."
            )

    def enqueue(
        self, task: Task[_P, _R], args: list[Any], kwargs: dict[str, Any]
    ) -> TaskResult[_P, _R]:
        """Write ``task``'s outbox row in the current transaction of :attr:`database`.

        The returned result's id is the Celery task id; ``task_enqueued`` is sent once
        the row is written (before COMMIT; a rollback takes the row back, not the signal).

        Raises
        ------
        InvalidTask
            When the task cannot run on this backend (Django's validation).
        TypeError
            When the arguments are not JSON (Django's rule for every backend).
        PayloadError
            When the outbox cannot store the message (see ``OutboxTask.apply_async``).
        """
        celery_task, options = self._prepare(task)
        app = self.celery_app
        result: TaskResult[_P, _R] = TaskResult(
            task=task,
            id=uuid(),
            status=statuses.READY,
            enqueued_at=None,
            started_at=None,
            finished_at=None,
            last_attempted_at=None,
            args=args,
            kwargs=kwargs,
            backend=self.alias,
            errors=[],
            worker_ids=[],
        )
        if self.supports_get_result:  # before the publish: a worker's state comes later
            transaction.on_commit(
                lambda: _record_enqueued(app, result, options), self.database, robust=True
            )
        celery_task.apply_async(
            result.args, result.kwargs, task_id=result.id, using=self.database, **options
        )
        object.__setattr__(result, "enqueued_at", timezone.now())
        task_enqueued.send(type(self), task_result=result)
        return result

    def get_result(self, result_id: str) -> TaskResult[..., Any]:
        """The result of ``result_id`` (see :mod:`django_outbox.tasks.results`).

        Raises
        ------
        TaskResultDoesNotExist
            When no dead letter, result backend record or outbox row knows the id.
        NotImplementedError
            When results cannot be read (:attr:`supports_get_result` is False: why).
        """
        reason = checks.results_unreadable(self)
        if reason is not None:
            raise NotImplementedError(f"Task backend {self.alias!r} cannot read results: {reason}")
        return results.read_result(self, self.celery_app, result_id)

    def check(self, **kwargs: Any) -> list[Any]:
        """System checks of this backend's configuration (:mod:`django_outbox.tasks.checks`)."""
        return checks.check_backend(self)

    def _prepare(self, task: Task[..., Any]) -> tuple[OutboxTask, dict[str, Any]]:
        """``task`` validated, its Celery task and its ``apply_async`` options."""
        try:
            return self._prepared[task]
        except (KeyError, TypeError):  # TypeError: an option value that is not hashable
            pass
        self.validate_task(task)
        app = self.celery_app
        prepared = (self._celery_task(app, task), self._dispatch_options(task, app))
        if task.run_after is None:
            with suppress(TypeError):
                self._prepared[task] = prepared
        return prepared

    def _dispatch_options(self, task: Task[..., Any], app: Celery) -> dict[str, Any]:
        if self._low_first is None:
            self._low_first = runs_low_first(app.conf.broker_url)
        priority = broker_priority(task.priority, low_first=self._low_first)
        options: dict[str, Any] = {"priority": priority}
        if task.queue_name != DEFAULT_TASK_QUEUE_NAME:
            options["queue"] = task.queue_name
        if task.run_after is not None:
            options["eta"] = task.run_after
        return options

    def _celery_task(self, app: Celery, task: Task[..., Any]) -> OutboxTask:
        found = app.tasks.get(task.module_path)
        if not isinstance(found, OutboxTask):
            raise InvalidTask(
                f"The Celery app {app.main!r} has no outbox task {task.module_path!r}: was "
                "the app created after its tasks were defined, in another process?"
            )
        return found


def _record_enqueued(app: Celery, result: TaskResult[..., Any], options: dict[str, Any]) -> None:
    """Write ``PENDING`` with the task's name and arguments to the result backend, unless
    a worker already wrote a state (a later dispatch of the transaction was published
    before this ran).
    """
    backend = app.backend
    if backend.get_task_meta(result.id, cache=False).get("status") != PENDING:
        return
    request = Context(
        task=result.task.module_path,
        args=result.args,
        kwargs=result.kwargs,
        retries=0,
        delivery_info={"routing_key": options.get("queue")},
    )
    backend.store_result(result.id, None, PENDING, request=request)
