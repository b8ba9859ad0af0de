"""Value objects that cross the store boundary: outbox rows, claims and dead letters."""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass
from datetime import datetime
from typing import Any

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
    ``completed`` when its task finished after all through a duplicate delivery."""

    DEAD = "dead"
    REQUEUED = "requeued"
    DISCARDED = "discarded"
    COMPLETED = "completed"


@dataclass(frozen=True, kw_only=True)
class CancelledRow:
    """A pending row a cancel deleted: ``leased`` when a publisher had taken it (it may
    be on the broker or in a worker: only Celery's revoke stops it); ``root_id`` the
    workflow it was a step of, closed ``cancelled`` by the same transaction."""

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
    exchange, routing key, queue and content type (see :mod:`celery_outbox.envelope`).
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
