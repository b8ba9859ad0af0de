"""Row <-> record for the Django store, over the core's one mapping
(:mod:`celery_outbox.store.records`).

Every conversion of the Django store goes through here: model instances built from the
core's column values, records read back from model instances, and the parameters of the
raw upsert (:mod:`django_outbox.store.statements`).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from datetime import datetime
from typing import Any

from django.db.models import Field

from celery_outbox.store import records as core
from celery_outbox.store.base import StoredWorkflow
from celery_outbox.store.records import (
    NewDeadLetter,
    NewMessage,
    StoredCompletion,
    StoredDeadLetter,
    StoredMessage,
    WorkflowStatus,
)
from django_outbox.models import CompletedTask, DeadLetter, OutboxMessage, Workflow

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
_DATETIMES = frozenset({"available_at", "locked_until", "created_at"})


def new_message(message: NewMessage, *, created_at: datetime) -> OutboxMessage:
    """An unsaved ``pending`` row for ``message`` (``created_at``: the database's clock)."""
    return OutboxMessage(**core.message_columns(message, created_at=created_at))


def stored_message(row: OutboxMessage, *, locked_until: datetime | None = None) -> StoredMessage:
    """The record of an outbox row (with ``locked_until`` replaced when given)."""
    record = core.stored_message(row)
    return (
        record if locked_until is None else dataclasses.replace(record, locked_until=locked_until)
    )


@functools.cache
def new_message_columns() -> tuple[str, ...]:
    """The database columns of :data:`NEW_MESSAGE_FIELDS`, in that order."""
    by_name: dict[str, Field[Any, Any]] = {
        field.name: field for field in OutboxMessage._meta.concrete_fields
    }
    return tuple(str(by_name[name].column) for name in NEW_MESSAGE_FIELDS)


def new_message_params(message: NewMessage, connection: Any, *, created_at: datetime) -> list[Any]:
    """The values of :data:`NEW_MESSAGE_FIELDS` for a raw ``INSERT`` on ``connection``.

    The hot path of every dispatch: no model instance and no per-field preparation
    (both cost more than the INSERT's round trip); the values are adapted directly.
    """
    values = core.message_columns(message, created_at=created_at)
    # JSON text: both databases read it into the column.
    values["options"] = json.dumps(values["options"])
    when = connection.ops.adapt_datetimefield_value
    return [when(values[f]) if f in _DATETIMES else values[f] for f in NEW_MESSAGE_FIELDS]


def new_dead_letter(letter: NewDeadLetter) -> DeadLetter:
    """An unsaved ``dead`` letter row for ``letter``."""
    return DeadLetter(**core.letter_columns(letter))


def stored_dead_letter(row: DeadLetter) -> StoredDeadLetter:
    """The record of a dead letter row."""
    return core.stored_letter(row)


def stored_completion(row: CompletedTask) -> StoredCompletion:
    """The record of a ``CompletedTask`` row."""
    return StoredCompletion(
        task_id=row.task_id,
        task_name=row.task_name,
        completed_at=row.completed_at,
        result=row.result,
        root_id=row.root_id,
    )


def stored_workflow(row: Workflow) -> StoredWorkflow:
    """The record of a ``Workflow`` row."""
    status: WorkflowStatus = row.status  # type: ignore[assignment]
    return StoredWorkflow(
        root_id=row.root_id,
        name=row.name,
        status=status,
        steps_total=row.steps_total,
        steps_done=row.steps_done,
        created_at=row.created_at,
        finished_at=row.finished_at,
        failed_task_id=row.failed_task_id,
    )
