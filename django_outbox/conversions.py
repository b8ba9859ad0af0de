"""Between model instances and the core's records (:mod:`celery_outbox.records`)."""

from __future__ import annotations

from datetime import datetime

from celery_outbox.records import (
    DeadLetterStatus,
    MessageStatus,
    NewDeadLetter,
    StoredDeadLetter,
    StoredMessage,
)
from django_outbox.models import DeadLetter, OutboxMessage


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
