"""Dead letters on SQLAlchemy: write, read back, requeue (compare-and-set), discard.

A letter of a workflow's step marks the workflow failed, and its requeue resumes it, in
the letter's own transaction (the caller's).
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Table, select, update

from celery_outbox.sqlalchemy import statements as inserts
from celery_outbox.sqlalchemy.tables import OutboxTables
from celery_outbox.sqlalchemy.types import require_aware, store_errors
from celery_outbox.sqlalchemy.workflows import mark_failed, mark_resumed
from celery_outbox.store.base import OutboxStore
from celery_outbox.store.records import (
    NewDeadLetter,
    NewMessage,
    StoredDeadLetter,
    letter_columns,
    message_columns,
    stored_letter,
)
from celery_outbox.store.transitions import COMPLETE, DISCARD, REQUEUE


class SQLAlchemyDeadLetters(OutboxStore):
    """The dead-letter half of :class:`~celery_outbox.sqlalchemy.SQLAlchemyOutboxStore`."""

    tables: OutboxTables
    #: The caller's transaction (``SQLAlchemyOutboxStore._caller_transaction``).
    _caller_transaction: Callable[[], AbstractContextManager[Connection]]

    def add_dead_letter(
        self, letter: NewDeadLetter, *, using: str | None = None, workflow: str | None = None
    ) -> int:
        with store_errors("write a dead letter"), self._caller_transaction() as conn:
            letter_id = insert(conn, self.tables.dead_letter, letter)
            if workflow is not None:
                now = letter.failed_at
                mark_failed(conn, self.tables.workflow, workflow, letter.task_id, now=now)
            return letter_id

    def get_dead_letter(
        self, letter_id: int, *, using: str | None = None
    ) -> StoredDeadLetter | None:
        with store_errors("read a dead letter"), self._caller_transaction() as conn:
            return get(conn, self.tables.dead_letter, letter_id)

    def requeue_dead_letter(
        self,
        letter_id: int,
        message: NewMessage,
        *,
        by: str,
        now: datetime,
        using: str | None = None,
        workflow: str | None = None,
    ) -> tuple[str, int | None]:
        require_aware(now=now)
        values = message_columns(message, created_at=self.now(using=using))
        with store_errors("requeue a dead letter"), self._caller_transaction() as conn:
            task_id, row_id = requeue(conn, self.tables, letter_id, message=values, by=by, now=now)
            if row_id is not None and workflow is not None:
                mark_resumed(conn, self.tables.workflow, workflow)
            return task_id, row_id

    def discard_dead_letter(self, letter_id: int, *, using: str | None = None) -> bool:
        with store_errors("discard a dead letter"), self._caller_transaction() as conn:
            return discard(conn, self.tables.dead_letter, letter_id)

    def complete_dead_letters(self, task_id: str, *, using: str | None = None) -> int:
        table = self.tables.dead_letter
        stmt = (
            update(table)
            .where(table.c.task_id == task_id, table.c.status.in_(COMPLETE.sources))
            .values(status=COMPLETE.target)
        )
        with store_errors("complete a dead letter"), self._caller_transaction() as conn:
            return int(conn.execute(stmt).rowcount)


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
    table = tables.dead_letter
    task_id = str(message["task_id"])
    # A compare-and-set on the status: two concurrent requeues write one row.
    marked = conn.execute(
        update(table)
        .where(table.c.id == letter_id, table.c.status.in_(REQUEUE.sources))
        .values(
            status=REQUEUE.target,
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
        .where(table.c.id == letter_id, table.c.status.in_(DISCARD.sources))
        .values(status=DISCARD.target)
    )
    return bool(conn.execute(stmt).rowcount == 1)
