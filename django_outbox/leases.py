"""The on-commit publisher's statements on PostgreSQL, in raw SQL.

On this hot path (every commit that dispatched a task) building an ORM query costs more
than its round trip: about 550 µs against 210 µs for the same ``SELECT`` on loopback.
Both statements take the rows as two arrays, ``unnest``-ed into ``(id, lease)`` pairs,
so each row is checked against its own lease, whatever the number of rows.

Deleting published rows commits asynchronously (``synchronous_commit = off``, set for
that statement's own transaction only): losing the delete in a database crash only
publishes the rows again, so it need not wait for the WAL flush. It is never done
inside a caller's transaction, whose commit must stay durable.
"""

from __future__ import annotations

from collections.abc import Sequence

from django.db import connections

from celery_outbox.records import OUTBOX_TABLE, Claim, StoredMessage

_PAIRS = "unnest(%s::bigint[], %s::timestamptz[]) AS lease(id, until)"

_STILL_LEASED = (
    f"SELECT m.id FROM {OUTBOX_TABLE} m JOIN {_PAIRS} "
    "ON m.id = lease.id AND m.locked_until = lease.until WHERE m.status = 'pending'"
)

_DELETE = (
    f"DELETE FROM {OUTBOX_TABLE} m USING {_PAIRS} "
    "WHERE m.id = lease.id AND m.locked_until = lease.until{async_commit}"
)

#: A one-time filter evaluated before any row is touched: this transaction only.
_ASYNC_COMMIT = " AND (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL"


def still_leased(messages: Sequence[StoredMessage], *, alias: str) -> set[int]:
    """The ids of ``messages`` whose row is pending and holds the message's own lease."""
    pairs = [(m.id, m.locked_until) for m in messages if m.locked_until is not None]
    if not pairs:
        return set()
    with connections[alias].cursor() as cursor:
        cursor.execute(_STILL_LEASED, [[i for i, _ in pairs], [lease for _, lease in pairs]])
        return {row_id for (row_id,) in cursor.fetchall()}


def delete_published(claim: Claim, ids: Sequence[int], *, alias: str) -> int:
    """Delete the rows ``ids`` of ``claim`` that still hold their lease; how many."""
    connection = connections[alias]
    wanted = set(ids)
    pairs = [(m.id, m.locked_until or claim.lease_until) for m in claim.messages if m.id in wanted]
    sql = _DELETE.format(async_commit="" if connection.in_atomic_block else _ASYNC_COMMIT)
    with connection.cursor() as cursor:
        cursor.execute(sql, [[i for i, _ in pairs], [lease for _, lease in pairs]])
        return int(cursor.rowcount)
