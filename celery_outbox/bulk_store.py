"""The store's part in batched dispatch (:mod:`celery_outbox.batching`): many rows, one INSERT.

A store that can tell which transaction a dispatch writes in (:meth:`BulkStore.transaction_token`)
lets a ``group(...)`` or a :func:`~celery_outbox.batching.batched_dispatch` block collect the
rows of that transaction and write them with :meth:`BulkStore.add_many`, one statement where
the database can. A store that cannot (the defaults) gets every row written at its call, as
without batching.
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from typing import TYPE_CHECKING

from celery_outbox.records import NewMessage


class BulkStore:
    """Mixin of :class:`~celery_outbox.storage.OutboxStore`: batched inserts (optional)."""

    def transaction_token(self, *, using: str | None = None) -> Hashable | None:
        """What a dispatch with ``using`` writes in now: equal tokens mean the same open
        transaction and the same savepoint; ``None`` outside a transaction (rows are
        committed at once there, and never batched) or when the store cannot tell."""
        return None

    def add_many(
        self, messages: Sequence[NewMessage], *, using: str | None = None
    ) -> list[int | None]:
        """Insert ``messages`` as ``pending`` rows in the caller's current transaction, in
        as few statements as the database allows (one on PostgreSQL and SQLite).

        The result is what ``[add(m, using=using) for m in messages]`` returns, in order:
        each new row's id, or ``None`` when its task id was already pending (in the table,
        or earlier in ``messages``). Nothing is superseded (such messages are added one by
        one). All or nothing: a failure writes no row.
        """
        # The default (and MySQL/MariaDB's, whose multi-row INSERT cannot tell which rows
        # the pending key refused): one add per row; the caller's transaction holds them.
        return [self.add(message, using=using) for message in messages]

    if TYPE_CHECKING:

        def add(self, message: NewMessage, *, using: str | None = None) -> int | None:
            """:meth:`~celery_outbox.storage.OutboxStore.add`."""
