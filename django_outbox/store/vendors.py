"""One strategy per database vendor, chosen once per database alias.

=================  ========================================================================
vendor             strategy
=================  ========================================================================
PostgreSQL         :class:`PostgreSQLStrategy`: upsert, one-statement claims outside a
                   transaction, lease checks and deletes by arrays (:mod:`.sql`)
SQLite             :class:`SQLiteStrategy`: upsert (3.35+), the ORM for the rest
MySQL / MariaDB    :class:`MySQLStrategy`: a plain insert checked by the unique key over
                   the generated ``pending_task_id``; the ORM for the rest (no
                   ``RETURNING``: the ORM path is written for them)
any other          :class:`~django_outbox.store.orm.OrmStrategy`
=================  ========================================================================
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime

from django.db import connections

from celery_outbox.records import Claim, NewMessage, StoredMessage
from django_outbox.store import published, sql
from django_outbox.store.orm import OrmStrategy


class SQLiteStrategy(OrmStrategy):
    """SQLite 3.35+: one ``INSERT ... ON CONFLICT ... RETURNING`` per dispatch."""

    def insert(self, message: NewMessage, *, alias: str) -> int | None:
        """Insert ``message`` unless its task id is already pending (one statement)."""
        return sql.upsert(message, alias=alias)


class MySQLStrategy(OrmStrategy):
    """MySQL/MariaDB: one ``INSERT`` per dispatch, refused by the key over pending task ids
    (:mod:`celery_outbox.pending_key`) when its task id is already pending."""

    def insert(self, message: NewMessage, *, alias: str) -> int | None:
        """Insert ``message`` unless its task id is already pending (one statement)."""
        return sql.insert_pending(message, alias=alias)


class PostgreSQLStrategy(OrmStrategy):
    """PostgreSQL: the hot paths in one raw statement each (:mod:`.sql`).

    Claims take one autocommit statement; inside a caller's atomic block they take the
    ORM path, which locks inside that block.
    """

    def insert(self, message: NewMessage, *, alias: str) -> int | None:
        """Insert ``message`` unless its task id is already pending (one statement)."""
        return sql.upsert(message, alias=alias)

    def still_leased(self, leased: Sequence[StoredMessage], *, alias: str) -> set[int]:
        """One ``SELECT`` joining the rows to their ``(id, lease)`` pairs."""
        pairs = [(m.id, m.locked_until) for m in leased if m.locked_until is not None]
        return sql.still_leased(pairs, alias=alias) if pairs else set()

    def claim_ids(
        self,
        ids: list[int],
        *,
        now: datetime,
        lease_until: datetime,
        max_bytes: int | None,
        alias: str,
    ) -> Claim:
        """Lease those of ``ids`` that are pending, due and unleased: one statement."""
        if connections[alias].in_atomic_block:
            return super().claim_ids(
                ids, now=now, lease_until=lease_until, max_bytes=max_bytes, alias=alias
            )
        found = sql.claim_ids(
            ids, now=now, lease_until=lease_until, max_bytes=max_bytes, alias=alias
        )
        return _claim_of(found, lease_until)

    def claim_due(
        self,
        *,
        now: datetime,
        created_before: datetime,
        limit: int,
        lease_until: datetime,
        max_bytes: int | None,
        alias: str,
    ) -> Claim:
        """Lease up to ``limit`` due rows within ``max_bytes``: one statement."""
        if connections[alias].in_atomic_block:
            return super().claim_due(
                now=now,
                created_before=created_before,
                limit=limit,
                lease_until=lease_until,
                max_bytes=max_bytes,
                alias=alias,
            )
        found = sql.claim_due(
            now=now,
            created_before=created_before,
            limit=limit,
            lease_until=lease_until,
            max_bytes=max_bytes,
            alias=alias,
        )
        return _claim_of(found, lease_until)

    def delete_published(self, claim: Claim, ids: Sequence[int], *, alias: str) -> int:
        """One ``DELETE`` of the rows still holding their lease; after a commit's publish,
        handed to a thread (:mod:`.published`), which deletes them soon after."""
        connection = connections[alias]
        if not connection.in_atomic_block and published.rows_of(alias).took(
            claim, ids, dialect=connection.vendor
        ):
            return len(ids)
        wanted = set(ids)
        pairs = [
            (m.id, m.locked_until or claim.lease_until) for m in claim.messages if m.id in wanted
        ]
        return published.delete_published(pairs, alias=alias)


def _claim_of(found: list[StoredMessage], lease_until: datetime) -> Claim:
    return Claim(messages=tuple(found), lease_until=lease_until)


#: The strategy of each alias, chosen on its first use.
_CHOSEN: dict[str, OrmStrategy] = {}


def strategy_for(alias: str) -> OrmStrategy:
    """The strategy of database ``alias`` (chosen once, from its vendor and features)."""
    strategy = _CHOSEN.get(alias)
    if strategy is None:
        strategy = _CHOSEN[alias] = _choose(alias)
    return strategy


def _choose(alias: str) -> OrmStrategy:
    connection = connections[alias]
    if connection.vendor == "postgresql":
        return PostgreSQLStrategy()
    if connection.vendor == "sqlite" and connection.features.can_return_columns_from_insert:
        return SQLiteStrategy()
    if connection.vendor == "mysql":
        return MySQLStrategy()
    return OrmStrategy()
