"""Write, requeue and discard dead letters (the core of every surface that does so)."""

from __future__ import annotations

import json
import traceback
from collections.abc import Mapping
from datetime import datetime
from typing import Any

from celery import Celery
from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.uuid import uuid

from celery_outbox import tracing
from celery_outbox.canvas_shape import workflow_root
from celery_outbox.config import OutboxConfig
from celery_outbox.envelope import build_message
from celery_outbox.escaping import LETTER_TEXT_CHARS, is_incomplete, original_arguments
from celery_outbox.exceptions import (
    ArgumentsMismatch,
    DeadLetterCompleted,
    DeadLetterDiscarded,
    OutboxError,
)
from celery_outbox.long_text import bounded
from celery_outbox.records import DeadLetterStatus, NewDeadLetter, StoredMessage
from celery_outbox.registry import store_for
from celery_outbox.relay import relay_for
from celery_outbox.signals import dead_letter_requeued
from celery_outbox.worker.arguments import mismatch

#: Routing keys of ``DeadLetter.options`` reused by a requeue.
ROUTING_KEYS = ("queue", "exchange", "routing_key", "priority")
#: Key of ``DeadLetter.options`` holding the failed run's trace context (message headers).
TRACE_OPTION = "trace"


def as_json(value: Any) -> Any:
    """``value`` as plain JSON data, keeping Kombu's typed values (datetime, Decimal, UUID).

    Kombu's JSON decoder turns the ``{"__type__": ...}`` objects back into their types,
    so a requeued task receives the values it was first given.
    """
    try:
        return json.loads(kombu_dumps(value))
    except (TypeError, ValueError):
        return json.loads(json.dumps(value, default=repr))


def exception_path(exc: BaseException) -> str:
    """The dotted path of an exception's class, such as ``builtins.ValueError``."""
    return f"{type(exc).__module__}.{type(exc).__qualname__}"


def build_dead_letter(
    *,
    task_name: str,
    task_id: str,
    args: Any,
    kwargs: Any,
    options: Mapping[str, Any],
    exc: BaseException,
    retries: int,
    first_failed_at: datetime,
    failed_at: datetime,
    reason: str = "",
) -> NewDeadLetter:
    """The dead letter of a task that ended with ``exc`` (and no retry); its message and
    traceback bounded to :data:`LETTER_TEXT_CHARS` each, with a note of what was cut."""
    message = bounded(str(exc) or reason, LETTER_TEXT_CHARS)
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return NewDeadLetter(
        task_id=task_id,
        task_name=task_name,
        args=as_json(list(args or ())),
        kwargs=as_json(dict(kwargs or {})),
        options=as_json(dict(options)),
        exception_type=exception_path(exc),
        exception_message=message,
        traceback=bounded(trace, LETTER_TEXT_CHARS),
        retries=retries,
        first_failed_at=first_failed_at,
        failed_at=failed_at,
    )


def requeue(app: Celery, letter_id: int, *, by: str = "", using: str | None = None) -> str:
    """Requeue a dead letter as a new task (fresh retry budget, same args).

    Arguments that were escaped to be stored (NaN, NUL ...) are restored from the
    letter's ``options["original"]``. The new task is dispatched in the trace of the run
    that failed (``options["trace"]``, with OpenTelemetry), not in the caller's.

    The new outbox row is written in the caller's transaction and published on commit.
    Requeuing a letter already requeued does nothing and returns its existing task id.

    Returns
    -------
    str
        The id of the new task (also stored as ``requeued_task_id``).

    Raises
    ------
    LookupError
        No dead letter has that id.
    DeadLetterDiscarded
        The letter is discarded, or was discarded while this requeue ran.
    DeadLetterCompleted
        The letter's task completed after all (status ``completed``).
    OutboxError
        The letter's task is not registered with ``app``, or the letter was stored
        without its arguments (:func:`celery_outbox.escaping.minimal_letter`), or they
        do not fit the task's signature any more (:class:`ArgumentsMismatch`).
    """
    store = store_for(app)
    letter = store.get_dead_letter(letter_id, using=using)
    if letter is None:
        raise LookupError(f"No dead letter with id {letter_id!r}.")
    if letter.requeued_task_id:
        return letter.requeued_task_id
    if letter.status == DeadLetterStatus.DISCARDED:
        raise _discarded(letter_id)
    if letter.status == DeadLetterStatus.COMPLETED:
        raise DeadLetterCompleted(
            f"Cannot requeue dead letter {letter_id}: its task {letter.task_id} completed "
            "after the letter was written (a duplicate delivery); requeueing it would run "
            "the task again. It was not dispatched."
        )
    task = app.tasks.get(letter.task_name)
    if task is None:
        raise OutboxError(
            f"Cannot requeue dead letter {letter_id}: task "
            f"{letter.task_name!r} is not registered with this Celery app."
        )
    if is_incomplete(letter.options):
        raise OutboxError(
            f"Cannot requeue dead letter {letter_id}: it was stored without its arguments "
            "(see its exception message); dispatch the task again yourself."
        )
    config, now = OutboxConfig.from_celery(app), store.now(using=using)
    options = {k: v for k, v in letter.options.items() if k in ROUTING_KEYS and v is not None}
    canvas = letter.options.get("canvas") or {}
    options.update(canvas)  # a workflow step resumes its workflow where it stopped
    args, kwargs = original_arguments(letter.args, letter.kwargs, letter.options)
    problem = mismatch(task, tuple(args), kwargs)
    if problem is not None:  # the task changed since: say so, the letter stays dead
        raise ArgumentsMismatch(
            f"Cannot requeue dead letter {letter_id} of task {letter.task_name!r}: its "
            f"arguments {problem}. It stays dead: requeue it once the task accepts them, "
            "or discard it."
        )
    new_id = uuid()
    with tracing.attached(letter.options.get(TRACE_OPTION) or {}):
        message = build_message(
            task,
            args,
            kwargs,
            task_id=new_id,
            options=options,
            now=now,
            park_after=config.park_after,
            max_bytes=None,
            lease=config.publish_grace,
        )
    workflow = workflow_root(new_id, canvas)
    task_id, row_id = store.requeue_dead_letter(
        letter_id,
        message,
        by=by,
        now=now,
        using=using,
        **({"workflow": workflow} if workflow else {}),
    )
    if row_id is None and not task_id:
        # The store found it no longer dead and not requeued: discarded meanwhile.
        raise _discarded(letter_id)
    if row_id is not None:
        if message.locked_until is not None:
            written = StoredMessage.written(message, row_id)
            store.defer_publish(written, relay_for(app).publisher(using), using=using)
        dead_letter_requeued.send(sender=app, letter_id=letter_id, task_id=task_id, by=by)
    return task_id


def _discarded(letter_id: int) -> DeadLetterDiscarded:
    return DeadLetterDiscarded(
        f"Cannot requeue dead letter {letter_id}: it is discarded (perhaps by someone else "
        "meanwhile); it was not dispatched."
    )


def discard(app: Celery, letter_id: int, *, using: str | None = None) -> bool:
    """Mark a ``dead`` letter ``discarded``; ``False`` when it was not ``dead``."""
    return store_for(app).discard_dead_letter(letter_id, using=using)
