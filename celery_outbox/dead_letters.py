r"""Dead letters: write, requeue and discard them, and the escaping that lets every store hold
them.

Dead letters every store can hold, whatever the failed task was given or raised.

JSON columns refuse NaN and Infinity (PostgreSQL ``jsonb``, SQLite's ``JSON_VALID``),
text columns refuse NUL, and no UTF-8 column takes a lone surrogate. A dead letter is
written once, so it is escaped before it is written: such values become text
(``"NaN"``, ``"Infinity"``, ``"\u0000"``, ``"\udc80"``), and the original of each
escaped field is kept as JSON text (ASCII, so storable anywhere) under
``options["original"]``, from which a requeue restores the task's real arguments.
When even the escaped letter is refused, :func:`minimal_letter` keeps the task's name,
id and the reason, and marks the letter ``incomplete`` so it is never requeued without
its arguments.

A letter is also bounded before it is written, so that no database refuses it for its
size (MySQL and MariaDB report a statement over ``max_allowed_packet`` as error 1153, or
as "server has gone away" when they drop the connection first, which looks like an
outage): its exception message and traceback keep :data:`LETTER_TEXT_CHARS` each
(:func:`celery_outbox.dead_letters.build_dead_letter`), and arguments larger than the
payload an outbox row may hold are not stored (:func:`within_budget`).

Write, requeue and discard dead letters (the core of every surface that does so).
"""

from __future__ import annotations

import json
import math
import traceback
from collections.abc import Mapping
from dataclasses import replace
from datetime import datetime
from typing import Any

from celery import Celery
from kombu.utils.json import dumps as kombu_dumps
from kombu.utils.uuid import uuid

from celery_outbox import tracing
from celery_outbox.config import OutboxConfig
from celery_outbox.dispatch.envelope import build_message
from celery_outbox.exceptions import (
    ArgumentsMismatch,
    DeadLetterCompleted,
    DeadLetterDiscarded,
    OutboxError,
)
from celery_outbox.long_text import bounded
from celery_outbox.registry import store_for
from celery_outbox.relay.relay import relay_for
from celery_outbox.signals import dead_letter_requeued
from celery_outbox.store.records import DeadLetterStatus, NewDeadLetter, StoredMessage
from celery_outbox.worker.arguments import mismatch
from celery_outbox.workflows.shape import workflow_root

# --- Dead letters every store can hold, whatever the failed task was given or raised.

#: Key of ``NewDeadLetter.options`` holding the originals of the escaped fields.
ORIGINAL_KEY = "original"

#: Key under :data:`ORIGINAL_KEY` set on a letter stored without its arguments.
INCOMPLETE_KEY = "incomplete"

#: The text each non-finite float becomes.
NON_FINITE = {math.inf: "Infinity", -math.inf: "-Infinity"}

#: Longest text kept in a minimal letter's fields (the columns hold 255 characters).
SHORT_TEXT = 255

#: Longest reason kept in a minimal letter's message.
LONG_TEXT = 2000

#: Most characters a dead letter keeps of its exception message, and of its traceback
#: (with a note of what was cut): a letter then fits every database's default limits
#: (MySQL's ``max_allowed_packet``: 4 MiB in 5.7, 16 MiB in MariaDB, 64 MiB in 8.0).
LETTER_TEXT_CHARS = 65_536

#: Key under :data:`ORIGINAL_KEY` of a letter stored without its arguments for their size:
#: the start and end of their JSON (:data:`LETTER_TEXT_CHARS`), for a person to read.
ARGUMENTS_KEY = "arguments"

_JSON_FIELDS = ("args", "kwargs", "options")

_TEXT_FIELDS = ("task_id", "task_name", "exception_type", "exception_message", "traceback")


def storable_text(text: str) -> str:
    """``text`` without NUL or lone surrogates (written as ``\\u0000``, ``\\udXXX``)."""
    return text.encode("utf-8", "backslashreplace").decode("utf-8").replace("\x00", "\\u0000")


def storable_json(value: Any) -> Any:
    """``value`` (plain JSON data) with every non-finite float and bad string as text."""
    if isinstance(value, float) and not math.isfinite(value):
        return NON_FINITE.get(value, "NaN")
    if isinstance(value, str):
        return storable_text(value)
    if isinstance(value, (list, tuple)):
        return [storable_json(item) for item in value]
    if isinstance(value, Mapping):
        return {storable_text(str(key)): storable_json(item) for key, item in value.items()}
    return value


def original_text(value: Any) -> str:
    """``value`` as ASCII JSON text that keeps NaN, Infinity, NUL and lone surrogates."""
    return json.dumps(value, ensure_ascii=True, allow_nan=True, default=repr)


def escape_letter(letter: NewDeadLetter) -> NewDeadLetter:
    """``letter`` as every store can hold it; unchanged when nothing needed escaping."""
    escaped: dict[str, Any] = {f: storable_json(getattr(letter, f)) for f in _JSON_FIELDS}
    escaped.update({f: storable_text(getattr(letter, f)) for f in _TEXT_FIELDS})
    changed = {
        name: original_text(getattr(letter, name))
        for name, value in escaped.items()
        if original_text(value) != original_text(getattr(letter, name))
    }
    if not changed:
        return letter
    changed.pop("options", None)  # routing keys are escaped in place: nothing to restore
    options = {**escaped.pop("options"), **({ORIGINAL_KEY: changed} if changed else {})}
    return replace(letter, **escaped, options=options)


def minimal_letter(letter: NewDeadLetter, error: BaseException) -> NewDeadLetter:
    """The least dead letter of ``letter``: its task, its id and why it is not whole.

    For when the store refused even the escaped letter (``error``): the arguments are
    dropped (the worker logs their start) and the letter is marked ``incomplete``.
    """
    reason = storable_text(
        f"The dead letter could not be stored whole ({type(error).__name__}: {error}); "
        f"the worker logged the start of its arguments. The task failed with "
        f"{letter.exception_type}: {letter.exception_message}"
    )[:LONG_TEXT]
    return replace(
        letter,
        task_id=storable_text(letter.task_id)[:SHORT_TEXT],
        task_name=storable_text(letter.task_name)[:SHORT_TEXT],
        args=[],
        kwargs={},
        options={ORIGINAL_KEY: {INCOMPLETE_KEY: reason}},
        exception_type=storable_text(letter.exception_type)[:SHORT_TEXT],
        exception_message=reason,
        traceback="",
    )


def within_budget(letter: NewDeadLetter, *, max_bytes: int | None) -> NewDeadLetter:
    """``letter``, or, when its arguments and options take more than ``max_bytes`` of
    JSON (``outbox_max_payload_bytes``; ``None``: no limit), the letter without them.

    Such a letter keeps its exception and traceback, is marked ``incomplete`` with the
    reason (it is never requeued), and keeps the start and end of its arguments' JSON
    under ``options["original"]["arguments"]``.
    """
    if max_bytes is None:
        return letter
    size = len(original_text([letter.args, letter.kwargs, letter.options]).encode())
    if size <= max_bytes:
        return letter
    reason = (
        f"The arguments and options of this dead letter were {size:,} bytes of JSON, above "
        f"outbox_max_payload_bytes={max_bytes:,}: they were not stored, only their start "
        f"and end (options.original.{ARGUMENTS_KEY}); the letter cannot be requeued."
    )
    arguments = bounded(original_text([letter.args, letter.kwargs]), LETTER_TEXT_CHARS)
    return replace(
        letter,
        args=[],
        kwargs={},
        options={ORIGINAL_KEY: {INCOMPLETE_KEY: reason, ARGUMENTS_KEY: arguments}},
    )


def is_incomplete(options: Mapping[str, Any]) -> bool:
    """Whether a letter with these ``options`` was stored without its arguments."""
    original = options.get(ORIGINAL_KEY)
    return isinstance(original, Mapping) and INCOMPLETE_KEY in original


def original_arguments(
    args: list[Any], kwargs: dict[str, Any], options: Mapping[str, Any]
) -> tuple[list[Any], dict[str, Any]]:
    """A stored letter's arguments as the task was given them (escaped ones restored)."""
    original = options.get(ORIGINAL_KEY)
    if not isinstance(original, Mapping):
        return args, kwargs
    if isinstance(original.get("args"), str):
        args = json.loads(original["args"])
    if isinstance(original.get("kwargs"), str):
        kwargs = json.loads(original["kwargs"])
    return args, kwargs


# --- Write, requeue and discard dead letters (the core of every surface that does so).

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
    traceback bounded to :data:`LETTER_TEXT_CHARS` each, with a note of what was cut.
    """
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
        without its arguments (:func:`celery_outbox.dead_letters.minimal_letter`), or they
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
    config = OutboxConfig.from_celery(app)
    now = store.now(using=using)
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
