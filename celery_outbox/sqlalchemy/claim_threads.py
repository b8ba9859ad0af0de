"""The SQLAlchemy store's part in claiming ahead (:mod:`celery_outbox.claim_threads`).

Every claim of this store runs in a short transaction of its own on a connection of the
engine's pool, never in the caller's session, so a claim on another thread sees the same
committed rows. PostgreSQL only: its ``SKIP LOCKED`` claims are the ones measured
concurrent (:mod:`tests.integration.test_sweep`); the pool returns the claiming thread's
connection after each claim, so there is nothing to end.
"""

from __future__ import annotations

from sqlalchemy import Engine

from celery_outbox.storage import OutboxStore


class SQLAlchemyClaimThreads(OutboxStore):
    """The claim-ahead half of :class:`~celery_outbox.sqlalchemy.SQLAlchemyOutboxStore`."""

    engine: Engine

    def claims_aside(self, using: str | None = None) -> bool:
        """On PostgreSQL."""
        return self.engine.dialect.name == "postgresql"
