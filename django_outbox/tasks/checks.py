"""System checks of an ``OutboxBackend`` (Django runs them through ``backend.check()``).

==========================  ==============================================================
id                          problem
==========================  ==============================================================
``django_outbox.E101``      no Celery app found (``OPTIONS["CELERY_APP"]`` does not import,
                            or the project never created one)
``django_outbox.E102``      a queue of ``QUEUES`` is not routed: Celery does not create
                            missing queues and ``task_queues`` does not declare it
``django_outbox.E103``      ``OPTIONS["DATABASE"]`` is not a database, or not one the sweep
                            covers (``DJANGO_OUTBOX_DATABASES``)
``django_outbox.W101``      ``get_result`` is unavailable (no result backend, or
                            ``result_extended`` off, or results ignored)
==========================  ==============================================================
"""

from __future__ import annotations

from collections.abc import Collection
from typing import Any, Protocol

from celery import Celery
from django.core.checks import CheckMessage, Error, Warning
from django.db import connections
from django.tasks import DEFAULT_TASK_QUEUE_NAME

from celery_outbox.exceptions import OutboxConfigError
from django_outbox.settings import settings


class CheckedBackend(Protocol):
    """What the checks read of an ``OutboxBackend``."""

    @property
    def alias(self) -> str:
        """The backend's alias in ``TASKS``."""

    @property
    def queues(self) -> Collection[str]:
        """The queues tasks may name (``QUEUES``)."""

    @property
    def database(self) -> str:
        """The database alias ``enqueue()`` writes to (``OPTIONS["DATABASE"]``)."""

    @property
    def celery_app(self) -> Celery:
        """The backend's Celery app (raises ``OutboxConfigError`` when none is found)."""


def check_backend(backend: CheckedBackend) -> list[CheckMessage]:
    """Every problem of ``backend``'s configuration."""
    try:
        app = backend.celery_app
    except OutboxConfigError as exc:
        hint = "Set TASKS[...]['OPTIONS']['CELERY_APP'] to the dotted path of your Celery app."
        return [Error(f"Task backend {backend.alias!r}: {exc}", hint=hint, id="django_outbox.E101")]
    problems: list[CheckMessage] = [
        Error(
            f"Task backend {backend.alias!r}: queue {queue!r} of QUEUES is not routed: "
            "task_create_missing_queues is off and task_queues does not declare it.",
            hint="Declare it in task_queues (CELERY_TASK_QUEUES) or remove it from QUEUES.",
            id="django_outbox.E102",
        )
        for queue in sorted(unrouted_queues(backend, app))
    ]
    problems.extend(_database_problems(backend))
    reason = results_unreadable(backend)
    if reason is not None:
        problems.append(
            Warning(
                f"Task backend {backend.alias!r} cannot read results ({reason}): "
                "get_result() raises NotImplementedError.",
                hint="Configure a Celery result backend with result_extended = True.",
                id="django_outbox.W101",
            )
        )
    return problems


def _database_problems(backend: CheckedBackend) -> list[CheckMessage]:
    if backend.database not in connections:
        return [
            Error(
                f"Task backend {backend.alias!r}: OPTIONS['DATABASE']={backend.database!r} "
                f"is not in DATABASES ({sorted(connections)}).",
                id="django_outbox.E103",
            )
        ]
    if backend.database not in settings.DATABASES:
        return [
            Error(
                f"Task backend {backend.alias!r} writes its rows to {backend.database!r}, "
                "which the sweep does not cover: a row whose publish after COMMIT failed "
                "would never be published.",
                hint=f"Add {backend.database!r} to DJANGO_OUTBOX_DATABASES.",
                id="django_outbox.E103",
            )
        ]
    return []


def unrouted_queues(backend: CheckedBackend, app: Any) -> set[str]:
    """The queues of ``QUEUES`` Celery would refuse to publish to."""
    if app.conf.task_create_missing_queues:
        return set()
    named = set(backend.queues) - {DEFAULT_TASK_QUEUE_NAME}  # "default": Celery's routing
    return named - set(app.amqp.queues)


def results_unreadable(backend: CheckedBackend) -> str | None:
    """Why ``backend`` cannot read results, or ``None`` when it can.

    The result backend must record the task's name and arguments (``result_extended``):
    without them a result cannot be told to be a Django task's.
    """
    try:
        conf = backend.celery_app.conf
    except OutboxConfigError as exc:
        return str(exc)
    if not conf.result_backend:
        return "the Celery app has no result_backend"
    if not conf.result_extended:
        return "result_extended is off (CELERY_RESULT_EXTENDED = True)"
    if conf.task_ignore_result:
        return "task_ignore_result is on"
    return None
