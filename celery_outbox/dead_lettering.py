"""Writing the dead letter of a failed task, from the worker.

A dead letter that cannot be written because the store is down puts the message back
(:func:`celery_outbox.failures.requeue_later`). One the store refuses as data is not an
outage: it is stored escaped (:mod:`celery_outbox.escaping`), else minimal, and the task
is never run again because its dead letter did not fit.
"""

from __future__ import annotations

import logging
from datetime import datetime
from typing import Any

from celery import Task

from celery_outbox.dead_letters import build_dead_letter
from celery_outbox.escaping import escape_letter, minimal_letter
from celery_outbox.exceptions import (
    OutboxConfigError,
    StoreDataError,
    StoreError,
    TooManyDeliveries,
)
from celery_outbox.failures import first_failed_at, requeue_later
from celery_outbox.records import NewDeadLetter
from celery_outbox.registry import store_for
from celery_outbox.retrying import Outcome
from celery_outbox.signals import task_dead_lettered

logger = logging.getLogger(__name__)


def write_dead_letter(
    task: Task[Any, Any],
    request: Any,
    exc: BaseException,
    *,
    outcome: Outcome,
    first_failed: datetime,
    now: datetime,
) -> int | None:
    """Write the dead letter of the running task and send ``task_dead_lettered``.

    The letter is escaped first (:mod:`celery_outbox.escaping`). A letter the store
    refuses as data (:class:`StoreDataError`, or any error that is not a
    :class:`StoreError`) is not an outage: a minimal letter is written instead, and if
    even that is refused the letter is logged and ``None`` returned. Either way the
    task is never run again because its dead letter did not fit.

    Raises
    ------
    celery.exceptions.Ignore
        When the store is unreachable: the message was put back with a delay
        (:func:`requeue_later`); ``Reject`` with requeue if that failed too.
    """
    letter = escape_letter(
        build_dead_letter(
            task_name=task.name,
            task_id=request.id,
            args=request.args,
            kwargs=request.kwargs,
            options=_routing(request),
            exc=exc,
            retries=request.retries,
            first_failed_at=first_failed,
            failed_at=now,
            reason=outcome.value,
        )
    )
    try:
        letter_id: int | None = _add_dead_letter(task, request, letter)
    except _Refused as refused:
        letter_id = _add_minimal_letter(task, request, letter, refused.cause)
    logger.error(
        "celery-outbox: %s[%s] is a dead letter (%s): %r", task.name, request.id, outcome.value, exc
    )
    if letter_id is not None:
        task_dead_lettered.send(sender=task, letter_id=letter_id, task_id=request.id, exception=exc)
    return letter_id


def write_config_dead_letter(
    task: Task[Any, Any],
    request: Any,
    exc: Exception,
    config_error: OutboxConfigError,
    *,
    first_failed: datetime,
    now: datetime,
) -> int | None:
    """A bad retry option found only at failure time: dead-letter the task, not lose it.

    The letter's exception is the :class:`OutboxConfigError` naming the option, caused
    by the task's own ``exc``.
    """
    error = OutboxConfigError(
        f"{config_error} The task failed with {type(exc).__name__}: {exc}; "
        "it was dead-lettered instead of retried."
    )
    error.__cause__ = exc
    return write_dead_letter(
        task, request, error, outcome=Outcome.BAD_OPTIONS, first_failed=first_failed, now=now
    )


class _Refused(Exception):
    """The store refused a letter as data (``cause``): writing it again cannot help."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _add_dead_letter(task: Task[Any, Any], request: Any, letter: NewDeadLetter) -> int:
    """Write ``letter``; put the message back on an outage, raise ``_Refused`` on data."""
    try:
        return store_for(task.app).add_dead_letter(letter)
    except StoreDataError as data_exc:
        raise _Refused(data_exc) from data_exc
    except (StoreError, OutboxConfigError) as write_exc:  # down, or no store installed yet
        logger.exception(
            "celery-outbox: could not write the dead letter of %s[%s]", task.name, request.id
        )
        requeue_later(task, request, write_exc)
    except Exception as other:  # a driver's value error (no DB-API class): data, not outage
        raise _Refused(other) from other


def _add_minimal_letter(
    task: Task[Any, Any], request: Any, letter: NewDeadLetter, cause: Exception
) -> int | None:
    """Write the minimal letter of ``letter``; ``None`` (logged) if refused too."""
    logger.error(
        "celery-outbox: the dead letter of %s[%s] was refused (%r); storing it without "
        "its arguments, which were: args=%r kwargs=%r",
        task.name,
        request.id,
        cause,
        request.args,
        request.kwargs,
    )
    try:
        return _add_dead_letter(task, request, minimal_letter(letter, cause))
    except _Refused:
        logger.critical(
            "celery-outbox: %s[%s] has no dead letter: even the minimal one was refused; "
            "it will not run again",
            task.name,
            request.id,
            exc_info=True,
        )
        return None


def _routing(request: Any) -> dict[str, Any]:
    info = dict(request.delivery_info or {})
    anonymous = info.get("exchange") in ("", None)
    return {
        "queue": info.get("routing_key") if anonymous else None,
        "exchange": None if anonymous else info.get("exchange"),
        "routing_key": None if anonymous else info.get("routing_key"),
        "priority": info.get("priority"),
    }


def write_redelivery_dead_letter(
    task: Task[Any, Any], request: Any, *, deliveries: int, limit: int, now: datetime
) -> TooManyDeliveries:
    """Dead-letter a message delivered more than ``limit`` times; the error to raise."""
    error = TooManyDeliveries(
        f"{task.name}[{request.id}] was delivered {deliveries} times without finishing "
        f"(outbox_max_deliveries={limit}); dead-lettered without running it."
    )
    write_dead_letter(
        task,
        request,
        error,
        outcome=Outcome.TOO_MANY_DELIVERIES,
        first_failed=first_failed_at(request, now),
        now=now,
    )
    return error
