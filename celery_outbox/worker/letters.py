"""Dead letters on the worker: a failed attempt's and an unknown task's.

Writing the dead letter of a failed attempt, from the worker.

A dead letter is bounded before it is written (:mod:`celery_outbox.dead_letters`: its
message and traceback cut, arguments larger than ``outbox_max_payload_bytes`` left out).
One that cannot be written because the store is down puts the message back, carrying
the letter (:func:`celery_outbox.worker.republish.requeue_later`). One the store refuses
as data is not an outage: it is stored escaped, else minimal, and the task is never run
again because its dead letter did not fit.

A message for a task the worker does not know becomes a dead letter, not a loss.

Celery's worker rejects such a message (it is gone: no requeue) and sends
``task_unknown``. For an app with an outbox store, the message is written as a dead
letter instead (its arguments, routing and place in its canvas), so it can be requeued
once the task is deployed; a workflow step marks its workflow failed, and a requeue
resumes it. The dead letter is written right after Celery rejected the message: a worker
lost in between loses it, as plain Celery would.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from celery import Celery, Task
from celery.exceptions import NotRegistered
from celery.signals import task_unknown

from celery_outbox import tracing
from celery_outbox.clock import utcnow
from celery_outbox.config import OutboxConfig
from celery_outbox.dead_letters import (
    TRACE_OPTION,
    as_json,
    build_dead_letter,
    escape_letter,
    minimal_letter,
    within_budget,
)
from celery_outbox.exceptions import (
    NoStoreConfigured,
    OutboxConfigError,
    OutboxError,
    StoreDataError,
    StoreError,
    TooManyDeliveries,
)
from celery_outbox.long_text import LOG_VALUE_CHARS, bounded, bounded_logger, loggable
from celery_outbox.registry import store_for
from celery_outbox.signals import task_dead_lettered
from celery_outbox.store.records import NewDeadLetter
from celery_outbox.worker.attempt import Attempt
from celery_outbox.worker.policy import Outcome
from celery_outbox.worker.republish import requeue_later
from celery_outbox.workflows.dispatch import JOIN_HEADER
from celery_outbox.workflows.shape import canvas_options, workflow_root

logger = bounded_logger(__name__)


# --- Writing the dead letter of a failed attempt, from the worker.


def write_dead_letter(
    task: Task[Any, Any],
    attempt: Attempt,
    exc: BaseException,
    *,
    outcome: Outcome,
    now: datetime,
) -> int | None:
    """Write the dead letter of ``attempt``, failed at ``now``; send ``task_dead_lettered``.

    The letter is escaped and bounded first (:func:`storable`). A letter the store
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
    letter = storable(
        task.app,
        build_dead_letter(
            task_name=task.name,
            task_id=attempt.task_id,
            args=attempt.args,
            kwargs=attempt.kwargs,
            options=_letter_options(attempt),
            exc=exc,
            retries=attempt.retries,
            first_failed_at=attempt.first_failed_at or now,
            failed_at=now,
            reason=outcome.value,
        ),
    )
    try:
        letter_id: int | None = _add_dead_letter(task, attempt, letter)
    except _Refused as refused:
        letter_id = _add_minimal_letter(task, attempt, letter, refused.cause)
    logger.error(
        "celery-outbox: %s[%s] is a dead letter (%s): %s",
        task.name,
        attempt.task_id,
        outcome.value,
        loggable(exc),
    )
    if letter_id is not None:
        task_dead_lettered.send(
            sender=task, letter_id=letter_id, task_id=attempt.task_id, exception=exc
        )
    return letter_id


#: Most characters of a pending letter's message, and of its traceback, in its header (a
#: message header must stay small: RabbitMQ's frames are 128 KiB).
PENDING_TEXT_CHARS = 8_192


def pending_letter(letter: NewDeadLetter) -> dict[str, Any]:
    """What a put-back message carries of ``letter`` (:data:`PENDING_LETTER_HEADER`):
    its failure, bounded; the arguments are the message's own.
    """
    return {
        "exception_type": letter.exception_type,
        "exception_message": bounded(letter.exception_message, PENDING_TEXT_CHARS),
        "traceback": bounded(letter.traceback, PENDING_TEXT_CHARS),
        "retries": letter.retries,
        "first_failed_at": letter.first_failed_at.isoformat(),
        "failed_at": letter.failed_at.isoformat(),
    }


def write_pending_letter(task: Task[Any, Any], attempt: Attempt) -> int | None:
    """Write the dead letter a put-back message carries (its body is not run again): the
    failure from its header, the arguments from the message. The store still failing
    puts it back again (:func:`requeue_later`).
    """
    pending = attempt.pending_letter or {}
    letter = storable(
        task.app,
        NewDeadLetter(
            task_id=attempt.task_id,
            task_name=task.name,
            args=as_json(list(attempt.args)),
            kwargs=as_json(dict(attempt.kwargs)),
            options=as_json(_letter_options(attempt)),
            exception_type=str(pending.get("exception_type")),
            exception_message=str(pending.get("exception_message") or ""),
            traceback=str(pending.get("traceback") or ""),
            retries=int(pending.get("retries") or attempt.retries),
            first_failed_at=_instant(pending.get("first_failed_at")),
            failed_at=_instant(pending.get("failed_at")),
        ),
    )
    try:
        letter_id: int | None = _add_dead_letter(task, attempt, letter)
    except _Refused as refused:
        letter_id = _add_minimal_letter(task, attempt, letter, refused.cause)
    logger.error(
        "celery-outbox: %s[%s] is a dead letter, written once its store was back (%s: %s)",
        task.name,
        attempt.task_id,
        letter.exception_type,
        bounded(letter.exception_message, LOG_VALUE_CHARS),
    )
    if letter_id is not None:
        task_dead_lettered.send(
            sender=task,
            letter_id=letter_id,
            task_id=attempt.task_id,
            exception=StoreError(f"{letter.exception_type}: {letter.exception_message}"),
        )
    return letter_id


def storable(app: Celery, letter: NewDeadLetter) -> NewDeadLetter:
    """``letter`` escaped, and within ``app``'s ``outbox_max_payload_bytes``
    (:mod:`celery_outbox.dead_letters`).
    """
    budget = OutboxConfig.at_run_time(app).max_payload_bytes
    return within_budget(escape_letter(letter), max_bytes=budget)


def _instant(value: Any) -> datetime:
    try:
        return datetime.fromisoformat(str(value))
    except ValueError:
        return utcnow()


def write_config_dead_letter(
    task: Task[Any, Any],
    attempt: Attempt,
    exc: Exception,
    config_error: OutboxError,
    *,
    now: datetime,
) -> int | None:
    """A bad retry option or ``retry()`` argument found only at failure time: dead-letter
    the task, not lose it.

    The letter's exception is an :class:`OutboxConfigError` naming the option (the text
    of ``config_error``), caused by the task's own ``exc``.
    """
    error = OutboxConfigError(
        f"{config_error} The task failed with {type(exc).__name__}: {exc}; "
        "it was dead-lettered instead of retried."
    )
    error.__cause__ = exc
    return write_dead_letter(task, attempt, error, outcome=Outcome.BAD_OPTIONS, now=now)


def write_redelivery_dead_letter(
    task: Task[Any, Any], attempt: Attempt, *, deliveries: int, limit: int, now: datetime
) -> TooManyDeliveries:
    """Dead-letter a message delivered more than ``limit`` times; the error to raise."""
    error = TooManyDeliveries(
        f"{task.name}[{attempt.task_id}] was delivered {deliveries} times without finishing "
        f"(outbox_max_deliveries={limit}); dead-lettered without running it."
    )
    write_dead_letter(task, attempt, error, outcome=Outcome.TOO_MANY_DELIVERIES, now=now)
    return error


def write_unreadable_limit_dead_letter(
    task: Task[Any, Any], attempt: Attempt, bad: OutboxConfigError, *, now: datetime
) -> OutboxConfigError:
    """Dead-letter a redelivered message whose ``outbox_max_deliveries`` cannot be read
    (a setting changed to a bad value while the worker runs); the error to raise.
    """
    error = OutboxConfigError(
        f"{bad} {task.name}[{attempt.task_id}] was redelivered and its delivery limit "
        "cannot be read; dead-lettered without running it (requeue it once the setting "
        "is fixed)."
    )
    write_dead_letter(task, attempt, error, outcome=Outcome.BAD_OPTIONS, now=now)
    return error


def _letter_options(attempt: Attempt) -> dict[str, Any]:
    """Where the message came from, and, for a workflow step, its place in the canvas
    (``canvas``: a requeue resumes the workflow from there); the trace of the failed
    run (its span, else the context it was delivered with: a requeue rejoins it).
    """
    canvas = canvas_options(attempt.options, headers=(JOIN_HEADER,))
    trace = tracing.current_headers() or dict(attempt.trace)
    return {
        **attempt.routing(),
        **({"canvas": canvas} if canvas else {}),
        **({TRACE_OPTION: trace} if trace else {}),
    }


class _Refused(Exception):
    """The store refused a letter as data (``cause``): writing it again cannot help."""

    def __init__(self, cause: Exception) -> None:
        super().__init__(str(cause))
        self.cause = cause


def _add_dead_letter(task: Task[Any, Any], attempt: Attempt, letter: NewDeadLetter) -> int:
    """Write ``letter``; put the message back on an outage, raise ``_Refused`` on data."""
    try:
        workflow = workflow_root(attempt.task_id, attempt.options)
        # (only for a workflow step: a store written before workflows keeps working)
        extra = {"workflow": workflow} if workflow else {}
        return store_for(task.app).add_dead_letter(letter, **extra)
    except StoreDataError as data_exc:
        raise _Refused(data_exc) from data_exc
    except (StoreError, OutboxConfigError) as write_exc:  # down, or no store installed yet
        logger.exception(
            "celery-outbox: could not write the dead letter of %s[%s]", task.name, attempt.task_id
        )
        requeue_later(task, attempt, write_exc, letter=pending_letter(letter))
    except Exception as other:  # a driver's value error (no DB-API class): data, not outage
        raise _Refused(other) from other


def _add_minimal_letter(
    task: Task[Any, Any], attempt: Attempt, letter: NewDeadLetter, cause: Exception
) -> int | None:
    """Write the minimal letter of ``letter``; ``None`` (logged) if refused too."""
    logger.error(
        "celery-outbox: the dead letter of %s[%s] was refused (%r); storing it without "
        "its arguments, which were: args=%s kwargs=%s",
        task.name,
        attempt.task_id,
        loggable(cause),
        loggable(attempt.args),
        loggable(attempt.kwargs),
    )
    try:
        return _add_dead_letter(task, attempt, minimal_letter(letter, cause))
    except _Refused:
        logger.critical(
            "celery-outbox: %s[%s] has no dead letter: even the minimal one was refused; "
            "it will not run again",
            task.name,
            attempt.task_id,
            exc_info=True,
        )
        return None


# --- A message for a task the worker does not know becomes a dead letter, not a loss.


def dead_letter_unknown(sender: Any, message: Any, name: str, id: str, **_: Any) -> int | None:
    """``task_unknown`` receiver: write the message's dead letter; its id, or ``None``
    when the app has no outbox store or the message cannot be read (logged).
    """
    app = sender.app
    try:
        store = store_for(app)
    except NoStoreConfigured:
        return None
    try:
        args, kwargs, embed = message.decode()
    except Exception:  # a body the worker cannot decode: nothing to keep but the log
        logger.exception("celery-outbox: could not read the unknown task %s[%s]", name, id)
        return None
    headers = message.headers or {}
    info = message.delivery_info or {}
    options = {
        "root_id": headers.get("root_id"),
        "parent_id": headers.get("parent_id"),
        "group_id": headers.get("group"),
        "group_index": headers.get("group_index"),
        "chord": (embed or {}).get("chord"),
        "chain": (embed or {}).get("chain"),
        "link": (embed or {}).get("callbacks"),
        "link_error": (embed or {}).get("errbacks"),
        "headers": headers,
    }
    canvas = canvas_options(options, headers=(JOIN_HEADER,))
    now = utcnow()
    hostname = getattr(sender, "hostname", "this worker")
    anonymous = info.get("exchange") in ("", None)
    letter = build_dead_letter(
        task_name=name,
        task_id=id,
        args=args,
        kwargs=kwargs,
        options={
            "queue": info.get("routing_key") if anonymous else None,
            "exchange": None if anonymous else info.get("exchange"),
            "routing_key": None if anonymous else info.get("routing_key"),
            "priority": info.get("priority"),
            **({"canvas": canvas} if canvas else {}),
        },
        exc=NotRegistered(f"task {name!r} is not registered on {hostname}"),
        retries=int(headers.get("retries") or 0),
        first_failed_at=now,
        failed_at=now,
    )
    workflow = workflow_root(id, options)
    extra = {"workflow": workflow} if workflow else {}
    try:
        letter_id = store.add_dead_letter(storable(app, letter), **extra)
    except Exception:  # the message is gone already: say so loudly
        logger.critical(
            "celery-outbox: unknown task %s[%s] was rejected and its dead letter could not be "
            "written: args=%s kwargs=%s",
            name,
            id,
            loggable(args),
            loggable(kwargs),
            exc_info=True,
        )
        return None
    logger.error("celery-outbox: unknown task %s[%s] is dead letter %s", name, id, letter_id)
    return letter_id


def install() -> None:
    """Connect :func:`dead_letter_unknown` to Celery's ``task_unknown`` (once)."""
    task_unknown.connect(dead_letter_unknown, weak=False, dispatch_uid="celery_outbox_unknown")
