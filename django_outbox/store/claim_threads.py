"""The Django store's part in claiming ahead (:mod:`celery_outbox.claim_threads`).

PostgreSQL only, and only outside an atomic block of the alias: the claiming thread has
a connection of its own (Django's connections belong to their thread), which sees only
committed rows. It is closed when the sweep ends (:meth:`end_claims_aside`).
"""

from __future__ import annotations

from django.db import connections

from celery_outbox.long_text import bounded_logger
from celery_outbox.storage import OutboxStore
from django_outbox.store.calls import alias_of

logger = bounded_logger(__name__)


class DjangoClaimThreads(OutboxStore):
    """The claim-ahead half of :class:`~django_outbox.store.DjangoOutboxStore`."""

    def claims_aside(self, using: str | None = None) -> bool:
        """PostgreSQL outside the caller's atomic block of ``using``."""
        connection = connections[alias_of(using)]
        return connection.vendor == "postgresql" and not connection.in_atomic_block

    def end_claims_aside(self) -> None:
        """Close the calling thread's connections."""
        for connection in connections.all(initialized_only=True):
            try:
                connection.close()
            except Exception:  # a broken connection is gone either way
                logger.debug("celery-outbox: closing a claiming connection failed", exc_info=True)
