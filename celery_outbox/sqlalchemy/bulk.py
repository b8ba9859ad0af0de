"""Batched dispatch in the SQLAlchemy store (:mod:`celery_outbox.batching`).

A batch's rows go to the caller's session in one statement on PostgreSQL and SQLite
(:func:`~celery_outbox.sqlalchemy.inserts.insert_many_pending`); MySQL/MariaDB, whose
multi-row ``INSERT`` fails whole on one pending task id, add them one by one. A task id
given twice in one batch is sent once: the first dispatch gets the row, as one by one.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from contextlib import AbstractContextManager
from datetime import datetime
from typing import TYPE_CHECKING

from sqlalchemy import Connection, Engine
from sqlalchemy.orm import Session

from celery_outbox.records import NewMessage
from celery_outbox.rows import message_columns
from celery_outbox.sqlalchemy import inserts, last_writes
from celery_outbox.sqlalchemy.boundary import store_errors
from celery_outbox.sqlalchemy.tables import OutboxTables
from celery_outbox.storage import OutboxStore

#: The dialects that take a batch in one statement.
_ONE_STATEMENT = ("postgresql", "sqlite")


class SQLAlchemyBulk(OutboxStore):
    """:class:`~celery_outbox.bulk_store.BulkStore` for ``SQLAlchemyOutboxStore``."""

    engine: Engine
    tables: OutboxTables

    if TYPE_CHECKING:

        def current_session(self) -> Session | None: ...
        def _caller_transaction(self) -> AbstractContextManager[Connection]: ...
        def now(self, *, using: str | None = None) -> datetime: ...

    def transaction_token(self, *, using: str | None = None) -> Hashable | None:
        """The session and its innermost open transaction (a savepoint's, nested);
        ``None`` when dispatches commit at once (no session in a transaction)."""
        session = self.current_session()
        if session is None or not session.in_transaction():
            return None
        return (session, session.get_nested_transaction() or session.get_transaction())

    def add_many(
        self, messages: Sequence[NewMessage], *, using: str | None = None
    ) -> list[int | None]:
        """One statement on PostgreSQL and SQLite; one per row elsewhere."""
        if self.engine.dialect.name not in _ONE_STATEMENT:
            return super().add_many(messages, using=using)
        first: dict[str, int] = {}
        for index, message in enumerate(messages):
            first.setdefault(message.task_id, index)
        created_at = self.now(using=using)
        rows = [message_columns(messages[i], created_at=created_at) for i in first.values()]
        with store_errors("add outbox rows"), self._caller_transaction() as conn:
            last_writes.write_held_insert(conn)  # a successor held for the end goes first
            ids = inserts.insert_many_pending(conn, self.tables.outbox, rows)
        return [
            ids.get(m.task_id) if first[m.task_id] == index else None
            for index, m in enumerate(messages)
        ]
