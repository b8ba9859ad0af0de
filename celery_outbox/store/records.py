"""What crosses the store boundary: records, their one row mapping, join parts.

Value objects that cross the store boundary: outbox rows, claims and dead letters.

Between records (:mod:`celery_outbox.store.records`) and table rows: one mapping for every store.

The column names are the fields of the records, the same in the Django models and the
SQLAlchemy tables; statuses are stored as their string values. A store writes the dict
of :func:`message_columns` or :func:`letter_columns` and reads a row back with
:func:`stored_message` or :func:`stored_letter`, from a mapping (a SQLAlchemy row
mapping, a ``QuerySet.values()`` dict) or from any object with those attributes (a
model instance).

The header parts of a chord join, as its ``results`` column holds them (every store).

The column is a JSON list with one slot per header step: ``null`` while the step is not
in, ``[result]`` once it is (``result`` a string, or ``null`` for a step that returned
``None``). Wrapping the result keeps "not in yet" apart from "returned ``None``", so a
step counted twice is recognised and changes nothing.
"""

from __future__ import annotations

import enum
import json
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any, Literal

# --- Value objects that cross the store boundary: outbox rows, claims and dead letters.

#: Name of the outbox table, shared by the Django model and the SQLAlchemy table.
OUTBOX_TABLE = "celery_outbox_message"

#: Name of the dead-letter table.
DEAD_LETTER_TABLE = "celery_outbox_deadletter"

#: Name of the table counting redeliveries of task messages (one row per redelivered task).
DELIVERY_TABLE = "celery_outbox_delivery"

#: Name of the table of atomic tasks that committed (one row per task id).
COMPLETED_TABLE = "celery_outbox_completedtask"

#: Name of the table of workflows (one row per canvas dispatched, keyed by its root id).
WORKFLOW_TABLE = "outbox_workflow"

#: Name of the table of chord joins (one row per chord whose header the database counts).
CHORD_JOIN_TABLE = "outbox_chord_join"

#: Name of the table recording when the sweep last ran (one row per database).
SWEEP_TABLE = "celery_outbox_sweep"

#: Longest task id the tables hold (``task_id`` columns).
TASK_ID_MAX_LENGTH = 255

#: Longest task name the tables hold (``task_name`` columns).
TASK_NAME_MAX_LENGTH = 255


class MessageStatus(str, enum.Enum):
    """Life of an outbox row: ``pending`` until published, ``failed`` when it gave up."""

    PENDING = "pending"
    PUBLISHED = "published"
    FAILED = "failed"


class DeadLetterStatus(str, enum.Enum):
    """Life of a dead letter: ``dead`` when written, then ``requeued`` or ``discarded``, or
    ``completed`` when its task finished after all through a duplicate delivery.
    """

    DEAD = "dead"
    REQUEUED = "requeued"
    DISCARDED = "discarded"
    COMPLETED = "completed"


#: Life of a workflow: ``running``, then ``succeeded``, ``failed`` (``running`` again
#: when its dead letter is requeued) or ``cancelled``.
WorkflowStatus = Literal["running", "succeeded", "failed", "cancelled"]


@dataclass(frozen=True, kw_only=True)
class CancelledRow:
    """A pending row a cancel deleted: ``leased`` when a publisher had taken it (it may
    be on the broker or in a worker: only Celery's revoke stops it); ``root_id`` the
    workflow it was a step of, closed ``cancelled`` by the same transaction.
    """

    id: int
    task_id: str
    task_name: str
    leased: bool
    root_id: str


def cancelled_row(
    row_id: int, task_id: str, task_name: str, options: Any, *, leased: bool
) -> CancelledRow:
    """The :class:`CancelledRow` of a stored row (its root from its message headers)."""
    headers = options.get("headers") if isinstance(options, Mapping) else None
    root = (headers or {}).get("root_id") or task_id
    return CancelledRow(
        id=row_id, task_id=task_id, task_name=task_name, leased=leased, root_id=str(root)
    )


def check_aware(name: str, value: datetime) -> datetime:
    """Return ``value`` if it is timezone-aware; raise ``ValueError`` naming it otherwise."""
    if value.tzinfo is None or value.utcoffset() is None:
        raise ValueError(f"{name}={value!r} is naive: give a timezone-aware datetime (UTC).")
    return value


@dataclass(frozen=True, kw_only=True)
class NewMessage:
    """A task message ready to be written to the outbox and later published as is.

    ``payload`` is the serialised Celery message body (base64 when the serializer is
    binary); ``options`` holds everything else a publish needs: headers, properties,
    exchange, routing key, queue and content type (see :mod:`celery_outbox.dispatch.envelope`).
    """

    task_id: str
    task_name: str
    payload: str
    options: Mapping[str, Any]
    available_at: datetime
    #: A new row due at once is born leased to its on-commit publisher until then (the
    #: publish grace), so that publisher needs no claim and no sweeper takes it before.
    locked_until: datetime | None = None

    def __post_init__(self) -> None:
        check_aware("available_at", self.available_at)
        if self.locked_until is not None:
            check_aware("locked_until", self.locked_until)


@dataclass(frozen=True, kw_only=True)
class StoredMessage(NewMessage):
    """An outbox row as read back from the store."""

    id: int
    status: MessageStatus = MessageStatus.PENDING
    attempts: int = 0
    last_error: str = ""
    created_at: datetime | None = None
    published_at: datetime | None = None

    @classmethod
    def written(cls, message: NewMessage, row_id: int) -> StoredMessage:
        """The row ``message`` became when the store wrote it as ``row_id``."""
        return cls(**{name: getattr(message, name) for name in _NEW_FIELDS}, id=row_id)


_NEW_FIELDS = tuple(NewMessage.__dataclass_fields__)


@dataclass(frozen=True, kw_only=True)
class Claim:
    """Rows leased to one publisher until ``lease_until``.

    The lease is also the fencing token: a store only marks a claimed row while its
    ``locked_until`` still equals the lease that row was claimed with, so a publisher
    whose lease expired (and whose rows another publisher took) cannot touch them.
    A sweep's claim leases every row until ``lease_until``; the rows one transaction
    wrote were each born with their own lease (:attr:`NewMessage.locked_until`).
    """

    messages: tuple[StoredMessage, ...]
    lease_until: datetime

    @property
    def leases(self) -> frozenset[datetime]:
        """The fencing tokens of the claimed rows (``lease_until`` for a sweep's claim)."""
        return frozenset(m.locked_until or self.lease_until for m in self.messages) or frozenset(
            {self.lease_until}
        )


@dataclass(frozen=True, kw_only=True)
class NewDeadLetter:
    """A task that ended without a retry, as written to the dead letters."""

    task_id: str
    task_name: str
    args: list[Any]
    kwargs: dict[str, Any]
    options: Mapping[str, Any]
    exception_type: str
    exception_message: str
    traceback: str
    retries: int
    first_failed_at: datetime
    failed_at: datetime


@dataclass(frozen=True, kw_only=True)
class StoredDeadLetter(NewDeadLetter):
    """A dead letter as read back from the store."""

    id: int
    status: DeadLetterStatus = DeadLetterStatus.DEAD
    requeued_at: datetime | None = None
    requeued_by: str = ""
    requeued_task_id: str = ""


@dataclass(frozen=True, kw_only=True)
class StoredCompletion:
    """An atomic task that committed: its ``CompletedTask`` row.

    ``result`` is the return value serialised with the task's serializer
    (:mod:`celery_outbox.worker.atomic`), ``None`` when the task returned ``None``.
    ``root_id`` is the workflow the task is a step of (``None`` outside one).
    """

    task_id: str
    task_name: str
    completed_at: datetime
    result: str | None = None
    root_id: str | None = None


# --- Between records (:mod:`celery_outbox.store.records`) and table rows: one mapping for
# every store.

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


# --- The header parts of a chord join, as its ``results`` column holds them (every store).


def empty_parts(size: int) -> str:
    """The ``results`` of a join waiting for ``size`` header steps."""
    return json.dumps([None] * size)


def with_part(parts: str, index: int, result: str | None) -> str | None:
    """``parts`` with header step ``index`` in, holding ``result``; ``None`` when that
    step is in already (nothing to write).

    Raises
    ------
    IndexError
        When ``index`` is outside the header.
    """
    slots = json.loads(parts)
    if not 0 <= index < len(slots):
        raise IndexError(f"Chord header step {index} is outside a header of {len(slots)} steps.")
    if slots[index] is not None:
        return None
    slots[index] = [result]
    return json.dumps(slots)


def part_results(parts: str) -> list[str | None]:
    """The results in header order (``None`` where a step is not in yet)."""
    return [None if slot is None else slot[0] for slot in json.loads(parts)]
