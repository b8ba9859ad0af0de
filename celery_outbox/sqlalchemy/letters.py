"""The SQL of the dead letters: write, read back, requeue (compare-and-set), discard."""

from __future__ import annotations

from collections.abc import Mapping
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Table, select, update

from celery_outbox.records import DeadLetterStatus, NewDeadLetter, StoredDeadLetter
from celery_outbox.rows import letter_columns, stored_letter
from celery_outbox.sqlalchemy import inserts
from celery_outbox.sqlalchemy.tables import OutboxTables

DEAD = DeadLetterStatus.DEAD.value


def insert(conn: Connection, table: Table, letter: NewDeadLetter) -> int:
    """Write ``letter`` as a ``dead`` letter; its id."""
    return inserts.inserted_id(conn.execute(table.insert().values(letter_columns(letter))))


def get(conn: Connection, table: Table, letter_id: int) -> StoredDeadLetter | None:
    """The letter with that id, or ``None``."""
    row = conn.execute(select(table).where(table.c.id == letter_id)).mappings().first()
    return None if row is None else stored_letter(row)


def requeue(
    conn: Connection,
    tables: OutboxTables,
    letter_id: int,
    *,
    message: Mapping[str, Any],
    by: str,
    now: datetime,
) -> tuple[str, int | None]:
    """Mark a ``dead`` letter requeued and insert ``message`` (row values); see the store."""
    table, task_id = tables.dead_letter, str(message["task_id"])
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
        return task_id, inserts.insert_pending(conn, tables.outbox, message)
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
