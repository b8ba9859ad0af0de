"""Row <-> record: between the Django store's rows and the core's records.

Every conversion of the Django store lives here (:mod:`celery_outbox.records` on one
side; model instances, or the parameters of the raw upsert, on the other).
"""

from __future__ import annotations

import functools
import json
from datetime import datetime
from typing import Any

from django.db.models import Field

from celery_outbox.clock import utcnow
from celery_outbox.records import (
    DeadLetterStatus,
    MessageStatus,
    NewDeadLetter,
    NewMessage,
    StoredDeadLetter,
    StoredMessage,
)
from django_outbox.models import DeadLetter, OutboxMessage

#: Columns a new outbox row is written with (``id`` comes from the database).
NEW_MESSAGE_FIELDS = (
    "task_id",
    "task_name",
    "payload",
    "options",
    "status",
    "available_at",
    "attempts",
    "last_error",
    "locked_until",
    "created_at",
)


def new_message(message: NewMessage) -> OutboxMessage:
    """An unsaved ``pending`` row for ``message``."""
    return OutboxMessage(
        task_id=message.task_id,
        task_name=message.task_name,
        payload=message.payload,
        options=dict(message.options),
        status=MessageStatus.PENDING.value,
        available_at=message.available_at,
        attempts=0,
        last_error="",
        locked_until=message.locked_until,
        created_at=utcnow(),
    )


@functools.cache
def new_message_columns() -> tuple[str, ...]:
    """The database columns of :data:`NEW_MESSAGE_FIELDS`, in that order."""
    by_name: dict[str, Field[Any, Any]] = {
        field.name: field for field in OutboxMessage._meta.concrete_fields
    }
    return tuple(str(by_name[name].column) for name in NEW_MESSAGE_FIELDS)


def new_message_params(message: NewMessage, connection: Any) -> list[Any]:
    """The values of :data:`NEW_MESSAGE_FIELDS` for a raw ``INSERT`` on ``connection``.

    The hot path of every dispatch: no model instance and no per-field preparation
    (both cost more than the INSERT's round trip); the values are adapted directly.
    """
    when = connection.ops.adapt_datetimefield_value
    return [
        message.task_id,
        message.task_name,
        message.payload,
        json.dumps(dict(message.options)),  # JSON text: both databases read it into the column
        MessageStatus.PENDING.value,
        when(message.available_at),
        0,
        "",
        when(message.locked_until),
        when(utcnow()),
    ]


def stored_message(row: OutboxMessage, *, locked_until: datetime | None = None) -> StoredMessage:
    """The record of an outbox row (with ``locked_until`` replaced when given)."""
    return StoredMessage(
        id=row.id,
        task_id=row.task_id,
        task_name=row.task_name,
        payload=row.payload,
        options=row.options,
        available_at=row.available_at,
        status=MessageStatus(row.status),
        attempts=row.attempts,
        last_error=row.last_error,
        locked_until=locked_until or row.locked_until,
        created_at=row.created_at,
        published_at=row.published_at,
    )


def new_dead_letter(letter: NewDeadLetter) -> DeadLetter:
    """An unsaved dead letter row for ``letter``."""
    return DeadLetter(
        task_id=letter.task_id,
        task_name=letter.task_name,
        args=list(letter.args),
        kwargs=dict(letter.kwargs),
        options=dict(letter.options),
        exception_type=letter.exception_type,
        exception_message=letter.exception_message,
        traceback=letter.traceback,
        retries=letter.retries,
        first_failed_at=letter.first_failed_at,
        failed_at=letter.failed_at,
        status=DeadLetterStatus.DEAD.value,
    )


def stored_dead_letter(row: DeadLetter) -> StoredDeadLetter:
    """The record of a dead letter row."""
    return StoredDeadLetter(
        id=row.id,
        task_id=row.task_id,
        task_name=row.task_name,
        args=row.args,
        kwargs=row.kwargs,
        options=row.options,
        exception_type=row.exception_type,
        exception_message=row.exception_message,
        traceback=row.traceback,
        retries=row.retries,
        first_failed_at=row.first_failed_at,
        failed_at=row.failed_at,
        status=DeadLetterStatus(row.status),
        requeued_at=row.requeued_at,
        requeued_by=row.requeued_by,
        requeued_task_id=row.requeued_task_id,
    )
