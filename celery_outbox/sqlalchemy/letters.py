"""The SQL of the dead letters: write, read back, requeue (compare-and-set), discard."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Table, select, update

from celery_outbox.records import DeadLetterStatus, NewDeadLetter, StoredDeadLetter
from celery_outbox.sqlalchemy import statements as sql

DEAD = DeadLetterStatus.DEAD.value

_FIELDS = (
    "task_id", "task_name", "args", "kwargs", "exception_type", "exception_message",
    "traceback", "retries", "first_failed_at", "failed_at",
)  # fmt: skip


def insert(conn: Connection, table: Table, letter: NewDeadLetter) -> int:
    """Write ``letter`` as a ``dead`` letter; its id."""
    values = {
        **{f: getattr(letter, f) for f in _FIELDS},
        "options": dict(letter.options),
        "status": DEAD,
        "requeued_at": None,
        "requeued_by": "",
        "requeued_task_id": "",
    }
    return sql.inserted_id(conn.execute(table.insert().values(values)))


def get(conn: Connection, table: Table, letter_id: int) -> StoredDeadLetter | None:
    """The letter with that id, or ``None``."""
    row = conn.execute(select(table).where(table.c.id == letter_id)).mappings().first()
    return None if row is None else _to_letter(row)


def requeue(
    conn: Connection,
    table: Table,
    outbox: Table,
    letter_id: int,
    *,
    message: Mapping[str, Any],
    by: str,
    now: datetime,
) -> tuple[str, int | None]:
    """Mark a ``dead`` letter requeued and insert ``message`` (row values); see the store."""
    task_id = str(message["task_id"])
    # A compare-and-set on the status: two concurrent requeues write one row.
    marked = conn.execute(
        update(table)
        .where(table.c.id == letter_id, table.c.status == DEAD)
        .values(
            status=DeadLetterStatus.REQUEUED.value,
            requeued_at=now,
            requeued_by=by,
            requeued_task_id=task_id,
        )
    )
    if marked.rowcount == 1:
        return task_id, sql.insert_pending(conn, outbox, message)
    existing = conn.execute(select(table.c.requeued_task_id).where(table.c.id == letter_id)).first()
    if existing is None:
        raise LookupError(f"No dead letter with id {letter_id}.")
    return str(existing[0]), None


def discard(conn: Connection, table: Table, letter_id: int) -> bool:
    """Mark a ``dead`` letter discarded; whether it was ``dead``."""
    stmt = (
        update(table)
        .where(table.c.id == letter_id, table.c.status == DEAD)
        .values(status=DeadLetterStatus.DISCARDED.value)
    )
    return bool(conn.execute(stmt).rowcount == 1)


def _to_letter(row: Mapping[Any, Any]) -> StoredDeadLetter:
    return StoredDeadLetter(
        **{f: row[f] for f in _FIELDS},
        options=row["options"],
        id=row["id"],
        status=DeadLetterStatus(row["status"]),
        requeued_at=row["requeued_at"],
        requeued_by=row["requeued_by"],
        requeued_task_id=row["requeued_task_id"],
    )
