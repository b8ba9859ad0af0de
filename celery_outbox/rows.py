"""Between records (:mod:`celery_outbox.records`) and table rows: one mapping for every store.

The column names are the fields of the records, the same in the Django models and the
SQLAlchemy tables; statuses are stored as their string values. A store writes the dict
of :func:`message_columns` or :func:`letter_columns` and reads a row back with
:func:`stored_message` or :func:`stored_letter`, from a mapping (a SQLAlchemy row
mapping, a ``QuerySet.values()`` dict) or from any object with those attributes (a
model instance).
"""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from celery_outbox.records import (
    DeadLetterStatus,
    MessageStatus,
    NewDeadLetter,
    NewMessage,
    StoredDeadLetter,
    StoredMessage,
)

#: The columns of an outbox row, ``id`` first.
MESSAGE_COLUMNS = ("id", *(f for f in StoredMessage.__dataclass_fields__ if f != "id"))
#: The columns of a dead letter, ``id`` first.
LETTER_COLUMNS = ("id", *(f for f in StoredDeadLetter.__dataclass_fields__ if f != "id"))

_NEW_LETTER_FIELDS = tuple(NewDeadLetter.__dataclass_fields__)


def message_columns(message: NewMessage, *, created_at: datetime) -> dict[str, Any]:
    """The column values of ``message`` written as a new ``pending`` row (no ``id``)."""
    return {
        "task_id": message.task_id,
        "task_name": message.task_name,
        "payload": message.payload,
        "options": dict(message.options),
        "status": MessageStatus.PENDING.value,
        "available_at": message.available_at,
        "attempts": 0,
        "last_error": "",
        "locked_until": message.locked_until,
        "created_at": created_at,
        "published_at": None,
    }


def stored_message(row: Mapping[str, Any] | object) -> StoredMessage:
    """The record of an outbox row (a mapping of its columns, or an object with them)."""
    get = _getter(row)
    return StoredMessage(
        id=get("id"),
        task_id=get("task_id"),
        task_name=get("task_name"),
        payload=get("payload"),
        options=get("options"),
        available_at=get("available_at"),
        status=MessageStatus(get("status")),
        attempts=get("attempts"),
        last_error=get("last_error"),
        locked_until=get("locked_until"),
        created_at=get("created_at"),
        published_at=get("published_at"),
    )


def letter_columns(letter: NewDeadLetter) -> dict[str, Any]:
    """The column values of ``letter`` written as a new ``dead`` letter (no ``id``)."""
    values: dict[str, Any] = {name: getattr(letter, name) for name in _NEW_LETTER_FIELDS}
    values.update(
        args=list(letter.args),
        kwargs=dict(letter.kwargs),
        options=dict(letter.options),
        status=DeadLetterStatus.DEAD.value,
        requeued_at=None,
        requeued_by="",
        requeued_task_id="",
    )
    return values


def stored_letter(row: Mapping[str, Any] | object) -> StoredDeadLetter:
    """The record of a dead letter row (a mapping of its columns, or an object with them)."""
    get = _getter(row)
    values = {name: get(name) for name in LETTER_COLUMNS}
    values["status"] = DeadLetterStatus(values["status"])
    return StoredDeadLetter(**values)


def _getter(row: Mapping[str, Any] | object) -> Any:
    if isinstance(row, Mapping):
        return row.__getitem__
    return lambda name: getattr(row, name)
