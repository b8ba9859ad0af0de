"""The SQLAlchemy store's part in waking the relay (:mod:`celery_outbox.wakeups`).

On PostgreSQL the LISTEN connection is a new connection of the engine's pool, detached
from it (the pool neither reuses nor recycles it); other dialects poll. The next parked
row's due time is one probe of the due-row index on every dialect.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import Engine, func, select, type_coerce

from celery_outbox.records import MessageStatus
from celery_outbox.sqlalchemy.boundary import store_errors
from celery_outbox.sqlalchemy.tables import OutboxTables
from celery_outbox.sqlalchemy.types import UTCDateTime
from celery_outbox.storage import OutboxStore
from celery_outbox.wakeups import Connector


class SQLAlchemyWakeups(OutboxStore):
    """The wake-up half of :class:`~celery_outbox.sqlalchemy.SQLAlchemyOutboxStore`."""

    engine: Engine
    tables: OutboxTables

    def next_due(self, *, after: datetime, using: str | None = None) -> datetime | None:
        """The first ``available_at`` after ``after`` of a pending row (the due-row index)."""
        c = self.tables.outbox.c
        first = select(type_coerce(func.min(c.available_at), UTCDateTime())).where(
            c.status == MessageStatus.PENDING.value, c.available_at > after
        )
        with store_errors("read the next due row"), self.engine.connect() as conn:
            found: datetime | None = conn.execute(first).scalar()
        return found

    def listen_connector(self, *, using: str | None = None) -> Connector | None:
        """PostgreSQL: a new DB-API connection detached from the pool; else ``None``."""
        if self.engine.dialect.name != "postgresql":
            return None
        return self._detached_connection

    def _detached_connection(self) -> Any:
        proxied = self.engine.raw_connection()
        connection = proxied.driver_connection  # None once detached
        proxied.detach()
        return connection
