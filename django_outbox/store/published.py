"""Deleting published rows (PostgreSQL): at once, or off the request's path.

:func:`delete_published` deletes rows fenced by their leases at once, one statement; it
commits asynchronously outside a caller's transaction (``synchronous_commit = off`` for
that statement's transaction only): losing the delete in a database crash only publishes
the rows again, so it need not wait for the WAL flush.

A transaction that wrote outbox rows publishes them right after its COMMIT; their
fenced ``DELETE`` then goes to a thread of the process
(:class:`celery_outbox.published_rows.PublishedRows`, one per database alias), which
deletes the rows of the commits of the next :data:`~celery_outbox.published_rows.FLUSH_AFTER`
seconds with one statement. The request pays its ``INSERT`` and the publish, not a third
round trip. The thread uses a connection of its own (Django's connections belong to their
thread), closed after :data:`~celery_outbox.published_rows.IDLE_AFTER` seconds without
rows. :func:`settle` deletes what waits and closes it at once: a test suite calls it
before its test database is dropped (the bundled pytest plugin does).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from datetime import datetime

from django.db import DatabaseError, connections

from celery_outbox.long_text import bounded_logger
from celery_outbox.published_rows import PublishedRows
from celery_outbox.records import OUTBOX_TABLE
from celery_outbox.storage import Supersedes
from django_outbox.store import sql

#: A one-time filter evaluated before any row is touched: this transaction only.
_ASYNC_COMMIT = " AND (SELECT set_config('synchronous_commit', 'off', true)) IS NOT NULL"

_DELETE = (
    f"DELETE FROM {OUTBOX_TABLE} m USING {sql.LEASE_PAIRS} "
    "WHERE m.id = lease.id AND m.locked_until = lease.until{async_commit}"
)

#: Rows of one claim, all under its lease (a sweep's batch): one array to bind, as text.
_DELETE_CLAIMED = (
    f"DELETE FROM {OUTBOX_TABLE} WHERE id = ANY(%s::bigint[]) AND locked_until = %s{{async_commit}}"
)

#: One row (a request's on-commit publish): no arrays to bind and plan, ~0.1 ms less.
_DELETE_ONE = f"DELETE FROM {OUTBOX_TABLE} WHERE id = %s AND locked_until = %s{{async_commit}}"

#: Rows of several commits, each fenced by one of their leases (committed asynchronously).
_DELETE_LEASED = (
    f"DELETE FROM {OUTBOX_TABLE} WHERE id = ANY(%s::bigint[]) AND locked_until = ANY(%s)"
    f"{_ASYNC_COMMIT}"
)

logger = bounded_logger(__name__)

_ROWS: dict[str, PublishedRows] = {}
_LOCK = threading.Lock()


def delete_published(pairs: Sequence[tuple[int, datetime]], *, alias: str) -> int:
    """Delete the ``(id, lease)`` pairs' rows still holding that lease, at once; how many.

    Asynchronous commit only outside a caller's transaction, whose commit must stay durable.
    """
    connection = connections[alias]
    async_commit = "" if connection.in_atomic_block else _ASYNC_COMMIT
    leases = {lease for _, lease in pairs}
    if len(pairs) == 1:
        statement, params = _DELETE_ONE.format(async_commit=async_commit), list(pairs[0])
    elif len(leases) == 1:
        statement = _DELETE_CLAIMED.format(async_commit=async_commit)
        params = [_id_array([i for i, _ in pairs]), leases.pop()]
    else:
        statement = _DELETE.format(async_commit=async_commit)
        params = [[i for i, _ in pairs], [lease for _, lease in pairs]]
    with connection.cursor() as cursor:
        cursor.execute(statement, params)
        return int(cursor.rowcount)


def delete_leased(ids: Sequence[int], leases: Sequence[datetime], *, alias: str) -> int:
    """Delete the rows ``ids`` still holding one of ``leases``, outside a transaction (the
    thread's statement); how many."""
    with connections[alias].cursor() as cursor:
        cursor.execute(_DELETE_LEASED, [_id_array(ids), list(leases)])
        return int(cursor.rowcount)


def _id_array(ids: Sequence[int]) -> str:
    # The ids as one array literal: psycopg's list dumper, in Python, took ~4% of a
    # sweep's samples for 500 ids (~10% for 500 ids and their leases).
    return "{" + ",".join(map(str, ids)) + "}"


def rows_of(alias: str) -> PublishedRows:
    """The published rows of database ``alias`` waiting for their ``DELETE``."""
    rows = _ROWS.get(alias)
    if rows is None:
        with _LOCK:
            rows = _ROWS.get(alias)
            if rows is None:
                rows = _ROWS[alias] = PublishedRows(
                    functools.partial(_delete, alias),
                    release=functools.partial(_close, alias),
                )
    return rows


def superseding(supersedes: Supersedes | None, *, task_id: str, alias: str) -> Supersedes | None:
    """``supersedes``, widened to the published rows of this process whose ``DELETE``
    still waits: a dispatch of their task id is a new call, which their row will not
    deliver (its message was sent), so it takes the row's place instead of vanishing
    into the idempotency key. ``None`` when neither applies (no statement more: a second
    dispatch of the same call stays one ``INSERT``)."""
    rows = _ROWS.get(alias)
    if rows is None or not rows.waits_for(task_id):
        return supersedes
    return lambda row: (
        rows.holds(row.id, row.locked_until) or (supersedes is not None and supersedes(row))
    )


def settle(timeout: float = 5.0) -> bool:
    """Delete every published row still waiting, in every database, and close the
    deleting threads' connections; whether all of them did within ``timeout`` seconds."""
    return all([rows.settle(timeout) for rows in list(_ROWS.values())])


def _delete(alias: str, ids: Sequence[int], leases: Sequence[datetime]) -> None:
    # A connection that died while idle (a database restart, a proxy's idle timeout)
    # fails its next statement: the delete is tried once more on a fresh connection, as
    # repeating a fenced DELETE is harmless. Failing again, the rows wait for the sweeper.
    try:
        delete_leased(ids, leases, alias=alias)
    except DatabaseError:
        _close(alias)
        logger.info("celery-outbox: deleting published rows again on a new connection")
        try:
            delete_leased(ids, leases, alias=alias)
        except Exception:
            _close(alias)  # the next flush starts on a fresh connection too
            raise


def _close(alias: str) -> None:
    connections[alias].close()
