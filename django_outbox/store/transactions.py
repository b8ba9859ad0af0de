"""The Django store's commits: one publish per transaction, the rows it wrote, deleting
published rows.

Which rows a commit is known to have written, so that its publisher need not read them.

A row a transaction wrote exists once the transaction commits, unless something took it
away before: a savepoint rolled back after the row was written (Django drops that
savepoint's ``on_commit`` callbacks, but a batch's callback registered earlier in an outer
block survives it), a failed statement in a transaction that committed anyway
(``set_rollback(False)``), or the store deleting a pending row in that transaction
(superseding a task id).

So each connection counts the statements that might have done so: every statement naming
``ROLLBACK`` or ``ABORT`` (Django rolls a savepoint back with ``cursor.execute()``, so its
own rollbacks and hand-written ones are seen alike), every statement that raised, and
every superseding insert (:func:`doubt`). A batch notes the count when its first row is
deferred (:func:`watch`); when its on-commit callback runs and the count has not moved,
every row of the batch was committed, and while that callback runs :func:`committed_rows`
names them: the store answers ``still_leased`` for them without a statement. When the
count moved, the rows are read back, as before. A ``ROLLBACK`` sent on the raw DBAPI
connection (``connection.connection.cursor()``) bypasses Django's cursor and is not seen.

One on-commit publish per transaction, however many rows it wrote.

Each database connection keeps one :class:`CommitBatch` per publisher, keyed by
:func:`celery_outbox.store.base.publisher_key` as in every store. The first row a
transaction defers registers the batch's ``on_commit`` callback; later rows join it, so
the commit runs one ``publish(messages)`` for all of them.

Django forgets a callback when the transaction, or the savepoint it was registered in,
rolls back. A batch whose callback is gone must not collect later rows (they would never
be published on commit), so before joining a batch we check that its callback is still
among the connection's on-commit callbacks, and start a new batch when it is not.

A batch whose rows are all known committed (:mod:`~django_outbox.store.transactions`) says so
while its callback runs, and the store skips reading them back.

Deleting published rows (PostgreSQL): at once, or off the request's path.

:func:`delete_published` deletes rows fenced by their leases at once, one statement; it
commits asynchronously outside a caller's transaction (``synchronous_commit = off`` for
that statement's transaction only): losing the delete in a database crash only publishes
the rows again, so it need not wait for the WAL flush.

A transaction that wrote outbox rows publishes them right after its COMMIT; their
fenced ``DELETE`` then goes to a thread of the process
(:class:`celery_outbox.store.published.PublishedRows`, one per database alias), which
deletes the rows of the commits of the next :data:`~celery_outbox.store.published.FLUSH_AFTER`
seconds with one statement. The request pays its ``INSERT`` and the publish, not a third
round trip. The thread uses a connection of its own (Django's connections belong to their
thread), closed after :data:`~celery_outbox.store.published.IDLE_AFTER` seconds without
rows. :func:`settle` deletes what waits and closes it at once: a test suite calls it
before its test database is dropped (the bundled pytest plugin does).
"""

from __future__ import annotations

import contextlib
import functools
import re
import threading
from collections.abc import Callable, Hashable, Iterator, Sequence
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from django.db import DatabaseError, connections, transaction

from celery_outbox.long_text import bounded_logger
from celery_outbox.store import published as published_rows
from celery_outbox.store.base import PublishCallback, Supersedes, publisher_key
from celery_outbox.store.published import PublishedRows
from celery_outbox.store.records import OUTBOX_TABLE, StoredMessage
from django_outbox._compat import add_execute_wrapper, on_commit_callbacks
from django_outbox.store import statements as sql

logger = bounded_logger(__name__)


# --- Which rows a commit is known to have written, so that its publisher need not read them.

#: Attribute of a Django connection holding its :class:`Doubts`.
_DOUBTS_ATTR = "_django_outbox_doubts"

#: Statements that may roll rows back (matched anywhere: a false match only costs a read).
_ROLLBACK = re.compile(r"\b(ROLLBACK|ABORT)\b", re.IGNORECASE)

#: The database alias and the ids of the rows known committed, while their callback runs.
_committed: ContextVar[tuple[str, frozenset[int]]] = ContextVar(
    "django_outbox_committed", default=("", frozenset())
)


class Doubts:
    """An ``execute_wrapper`` counting the statements of one connection that may have
    taken rows away (see the module's docstring).
    """

    def __init__(self) -> None:
        #: Grows with each such statement; only its changes mean anything.
        self.count = 0

    def __call__(
        self, execute: Callable[..., Any], sql: Any, params: Any, many: bool, context: Any
    ) -> Any:
        """Run the statement, counting it when it names a rollback or raises."""
        if not isinstance(sql, str) or _ROLLBACK.search(sql):
            self.count += 1  # a composed statement could be anything
        try:
            return execute(sql, params, many, context)
        except BaseException:
            self.count += 1
            raise


def watch(connection: Any) -> Doubts:
    """The :class:`Doubts` of ``connection`` (a Django ``DatabaseWrapper``), installed on
    first use: counting from then on.
    """
    doubts: Doubts | None = getattr(connection, _DOUBTS_ATTR, None)
    if doubts is None:
        doubts = Doubts()
        add_execute_wrapper(connection, doubts)
        setattr(connection, _DOUBTS_ATTR, doubts)
    return doubts


def doubt(connection: Any) -> None:
    """Some row deferred on ``connection`` may be gone at its commit (the store deleted a
    pending row): the batches open now read their rows back after the commit.
    """
    doubts: Doubts | None = getattr(connection, _DOUBTS_ATTR, None)
    if doubts is not None:
        doubts.count += 1


@contextlib.contextmanager
def known_committed(alias: str, ids: frozenset[int]) -> Iterator[None]:
    """Within the block, :func:`committed_rows` of ``alias`` names ``ids``."""
    token = _committed.set((alias, ids))
    try:
        yield
    finally:
        _committed.reset(token)


def committed_rows(alias: str) -> frozenset[int]:
    """While a commit's publisher runs: the ids of the rows of database ``alias`` that
    commit is known to have written; else empty.
    """
    known_alias, ids = _committed.get()
    return ids if known_alias == alias else frozenset()


# --- One on-commit publish per transaction, however many rows it wrote.

#: Attribute of a Django connection holding its batches, keyed by publisher.
_BATCHES_ATTR = "_django_outbox_batches"


class CommitBatch:
    """The rows one transaction deferred for one publisher; called once on commit."""

    def __init__(self, publish: PublishCallback, *, connection: Any, alias: str) -> None:
        self.publish = publish
        self.alias = alias
        self.messages: list[StoredMessage] = []
        #: The one callable registered with ``on_commit`` (kept: identity marks it).
        self.callback = self.publish_all
        #: The connection's doubts, and their count before the first row was written.
        self.doubts = watch(connection)
        self.mark = self.doubts.count

    def publish_all(self) -> None:
        """Publish every row of the batch; all of them known committed when nothing that
        could have taken one away happened since the batch began.
        """
        messages = tuple(self.messages)
        known = frozenset(m.id for m in messages) if self.doubts.count == self.mark else None
        with published_rows.deferring():  # their DELETE leaves the caller's path
            if known is None:
                self.publish(messages)
                return
            with known_committed(self.alias, known):
                self.publish(messages)

    def is_registered(self, connection: Any) -> bool:
        """Whether Django will still call this batch when ``connection`` commits."""
        return any(callback is self.callback for callback in on_commit_callbacks(connection))


def defer(message: StoredMessage, publish: PublishCallback, *, using: str) -> None:
    """Publish ``message`` with ``publish`` right after the current commit of ``using``.

    Outside an atomic block ``publish([message])`` runs at once.
    """
    connection = transaction.get_connection(using)
    if not connection.in_atomic_block:
        with published_rows.deferring():
            publish((message,))
        return
    batches: dict[Hashable, CommitBatch] = getattr(connection, _BATCHES_ATTR, None) or {}
    key = publisher_key(publish)
    batch = batches.get(key)
    if batch is None or not batch.is_registered(connection):
        batch = _new_batch(connection, batches, key, publish, using=using)
    batch.messages.append(message)


def _new_batch(
    connection: Any,
    batches: dict[Hashable, CommitBatch],
    key: Hashable,
    publish: PublishCallback,
    *,
    using: str,
) -> CommitBatch:
    # Drop batches Django already ran or discarded, so the dict never grows.
    live = {k: b for k, b in batches.items() if b.is_registered(connection)}
    batch = live[key] = CommitBatch(publish, connection=connection, alias=using)
    setattr(connection, _BATCHES_ATTR, live)
    # robust: a failing publisher never stops the caller's other on-commit callbacks.
    transaction.on_commit(batch.callback, using=using, robust=True)
    return batch


# --- Deleting published rows (PostgreSQL): at once, or off the request's path.

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
        statement = _DELETE_ONE.format(async_commit=async_commit)
        params = list(pairs[0])
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
    thread's statement); how many.
    """
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
    dispatch of the same call stays one ``INSERT``).
    """
    rows = _ROWS.get(alias)
    if rows is None or not rows.waits_for(task_id):
        return supersedes
    return lambda row: (
        rows.holds(row.id, row.locked_until) or (supersedes is not None and supersedes(row))
    )


def settle(timeout: float = 5.0) -> bool:
    """Delete every published row still waiting, in every database, and close the
    deleting threads' connections; whether all of them did within ``timeout`` seconds.
    """
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
