"""``DjangoOutboxStore``: the outbox through Django's ORM and its transactions.

Batched dispatch in the Django store: the rows of one batch in one ``INSERT``.

PostgreSQL and SQLite 3.35+ take every row of a batch in one statement,
``INSERT ... VALUES (...), (...) ON CONFLICT (task_id) WHERE status = 'pending' DO NOTHING
RETURNING id, task_id``: a row whose task id is already pending is skipped without
aborting the caller's transaction, and the returned task ids say which rows were written
(at most one pending row per task id, so a task id names one new row). A task id given twice
in one batch is sent once: the first dispatch gets the row, as one by one. SQLite caps the
parameters of a statement (``SQLITE_LIMIT_VARIABLE_NUMBER``, 32766 since 3.32, read from
the connection where Python can, else Django's 999): a batch over it takes one statement
per that many rows, in the same transaction. Other databases add the rows one by one
(MySQL/MariaDB: a multi-row ``INSERT`` fails whole on one pending task id).

The Django store's part in claiming ahead (:mod:`celery_outbox.store.base`).

PostgreSQL only, and only outside an atomic block of the alias: the claiming thread has
a connection of its own (Django's connections belong to their thread), which sees only
committed rows. It is closed when the sweep ends (:meth:`end_claims_aside`).

The Django store's part in waking the relay (:mod:`celery_outbox.store.base`).

PostgreSQL databases get a LISTEN connection of their own, opened with the settings
Django connects with but not managed by Django (no transaction, no pool, never closed
by ``close_old_connections``); other databases poll. The next parked row's due time is
one probe of the due-row index on every database.

``DjangoOutboxStore``: the outbox through Django's ORM and its transactions.

Every method takes ``using``, a database alias (``None`` means the running atomic task's
alias, else ``"default"``: :mod:`~django_outbox.store.calls`), and hands
the work to that alias's strategy (:mod:`~django_outbox.store.vendors`) or to the
vendor-independent dead letter code (:mod:`~django_outbox.store.letters`); workflows and
chord joins are :mod:`~django_outbox.store.workflows`. Rows are
written in whatever ``transaction.atomic(using=...)`` block the caller is in; database
errors leave as :class:`~celery_outbox.exceptions.StoreError` with the cause chained.
"""

from __future__ import annotations

import functools
import sqlite3
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar

from django.db import connections, transaction
from django.db.models import Min, Q

from celery_outbox.long_text import bounded_logger
from celery_outbox.store.base import Connector, OutboxStore, PublishCallback, Supersedes
from celery_outbox.store.records import (
    CancelledRow,
    Claim,
    MessageStatus,
    NewDeadLetter,
    NewMessage,
    StoredDeadLetter,
    StoredMessage,
    cancelled_row,
)
from django_outbox._compat import new_connection, on_commit_callbacks
from django_outbox.models import OutboxMessage
from django_outbox.settings import settings
from django_outbox.store import asynchronous, letters
from django_outbox.store import rows as convert
from django_outbox.store import transactions as batches
from django_outbox.store import transactions as commits
from django_outbox.store import transactions as published
from django_outbox.store.calls import alias_of, clock_of, refresh_connection, store_errors
from django_outbox.store.completions import DjangoCompletions
from django_outbox.store.monitoring import DjangoMonitoring
from django_outbox.store.vendors import messages, strategy_for
from django_outbox.store.workflows import DjangoWorkflows, mark_cancelled

logger = bounded_logger(__name__)


# --- Batched dispatch in the Django store: the rows of one batch in one ``INSERT``.

#: The multi-row upsert per (vendor, rows), built once.
_STATEMENTS: dict[tuple[str, int], str] = {}


def token(alias: str) -> Hashable | None:
    """The transaction a write to ``alias`` joins now: the connection and its savepoints;
    ``None`` outside an atomic block (the row commits at once).
    """
    connection = transaction.get_connection(alias)
    if not connection.in_atomic_block:
        return None
    return (alias, id(connection), tuple(connection.savepoint_ids))


def can_batch(alias: str) -> bool:
    """Whether ``alias`` takes a batch in one statement (PostgreSQL, SQLite 3.35+)."""
    connection = connections[alias]
    return connection.vendor == "postgresql" or (
        connection.vendor == "sqlite" and connection.features.can_return_columns_from_insert
    )


def upsert_many(messages: Sequence[NewMessage], *, alias: str) -> list[int | None]:
    """Insert ``messages`` (PostgreSQL, SQLite 3.35+); each one's row id, or ``None`` when
    its task id was already pending.
    """
    connection = connections[alias]
    first: dict[str, int] = {}
    for index, message in enumerate(messages):
        first.setdefault(message.task_id, index)
    unique = [messages[index] for index in first.values()]
    created_at = clock_of(alias)()
    params = []
    for message in unique:
        row = convert.new_message_params(message, connection, created_at=created_at)
        params.append([row[i] for i in _VARYING])
    ids: dict[str, int] = {}
    step = _rows_per_statement(connection)
    # Like the ORM: a failed statement marks the caller's atomic block for rollback.
    with transaction.mark_for_rollback_on_error(using=alias), connection.cursor() as cursor:
        for start in range(0, len(params), step):
            chunk = params[start : start + step]
            cursor.execute(_statement(connection, len(chunk)), [v for row in chunk for v in row])
            ids.update((str(task_id), int(row_id)) for row_id, task_id in cursor.fetchall())
    return [
        ids.get(m.task_id) if first[m.task_id] == index else None
        for index, m in enumerate(messages)
    ]


#: The columns every new row has the same value in, written as literals: fewer parameters
#: for the driver to parse and quote (a 100-row statement has 700, not 1,000).
_CONSTANT = {"status": f"'{MessageStatus.PENDING.value}'", "attempts": "0", "last_error": "''"}

#: The positions, in :data:`~.rows.NEW_MESSAGE_FIELDS`, of the columns that are parameters.
_VARYING = [i for i, f in enumerate(convert.NEW_MESSAGE_FIELDS) if f not in _CONSTANT]


def _rows_per_statement(connection: Any) -> int:
    columns = len(_VARYING)
    limit = connection.features.max_query_params
    if connection.vendor == "sqlite":
        raw = connection.connection
        getlimit = getattr(raw, "getlimit", None)  # Python 3.11+
        if getlimit is not None:
            limit = getlimit(getattr(sqlite3, "SQLITE_LIMIT_VARIABLE_NUMBER", 9))
    # PostgreSQL: 65535 parameters per statement (the protocol's 16-bit count).
    return max(1, (limit or 65535) // columns)


def _statement(connection: Any, rows: int) -> str:
    key = (connection.vendor, rows)
    sql = _STATEMENTS.get(key)
    if sql is None:
        quote = connection.ops.quote_name
        columns = convert.new_message_columns()
        one = f"({', '.join(_CONSTANT.get(f, '%s') for f in convert.NEW_MESSAGE_FIELDS)})"
        # The predicate is a literal: PostgreSQL infers the partial index at parse time.
        sql = (
            f"INSERT INTO {quote(OutboxMessage._meta.db_table)} "
            f"({', '.join(quote(column) for column in columns)}) "
            f"VALUES {', '.join([one] * rows)} "
            f"ON CONFLICT ({quote('task_id')}) WHERE {quote('status')} = "
            f"'{MessageStatus.PENDING.value}' DO NOTHING "
            f"RETURNING {quote('id')}, {quote('task_id')}"
        )
        if len(_STATEMENTS) < 64:  # the usual batch sizes; others are built each time
            _STATEMENTS[key] = sql
    return sql


# --- The Django store's part in claiming ahead (:mod:`celery_outbox.store.base`).


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


# --- The Django store's part in waking the relay (:mod:`celery_outbox.store.base`).


class DjangoWakeups(OutboxStore):
    """The wake-up half of :class:`~django_outbox.store.DjangoOutboxStore`."""

    def next_due(self, *, after: datetime, using: str | None = None) -> datetime | None:
        """The first ``available_at`` after ``after`` of a pending row (the due-row index)."""
        alias = alias_of(using)
        refresh_connection(alias)
        with store_errors("read the next due row"):
            later = messages(alias).filter(
                status=MessageStatus.PENDING.value, available_at__gt=after
            )
            found: datetime | None = later.aggregate(first=Min("available_at"))["first"]
        return found

    def listen_connector(self, *, using: str | None = None) -> Connector | None:
        """PostgreSQL: a new connection to ``using``'s database; elsewhere ``None``."""
        alias = alias_of(using)
        if connections[alias].vendor != "postgresql":
            return None
        return functools.partial(new_connection, alias)


# --- ``DjangoOutboxStore``: the outbox through Django's ORM and its transactions.

#: What a sync dispatch returns (see ``run_dispatch``).
_Result = TypeVar("_Result")


class DjangoOutboxStore(
    DjangoCompletions, DjangoWorkflows, DjangoMonitoring, DjangoWakeups, DjangoClaimThreads
):
    """The ORM store ``django_outbox`` installs as the default store in ``ready()``."""

    # -- dispatch -----------------------------------------------------------------------
    async def run_dispatch(self, dispatch: Callable[[], _Result]) -> _Result:
        """In ``sync_to_async(thread_sensitive=True)``: Django's thread for sync code, its
        connection and transaction (:mod:`~django_outbox.store.asynchronous`).
        """
        return await asynchronous.run_dispatch(dispatch)

    def now(self, *, using: str | None = None) -> datetime:
        """The database's clock; refused on an event loop's thread (the first thing a
        dispatch asks: a sync dispatch from async code names ``adelay``).
        """
        asynchronous.refuse_event_loop()
        return super().now(using=using)

    def add(
        self,
        message: NewMessage,
        *,
        using: str | None = None,
        supersedes: Supersedes | None = None,
    ) -> int | None:
        """Insert a pending row in the caller's transaction; ``None`` when its task id is
        already pending (``task_id`` is an idempotency key) with a row ``supersedes``
        does not accept.
        """
        asynchronous.refuse_event_loop()
        alias = alias_of(using)
        strategy = strategy_for(alias)
        with store_errors("write an outbox row"):
            row_id = strategy.insert(message, alias=alias)
            if row_id is not None:
                return row_id
            accepts = published.superseding(supersedes, task_id=message.task_id, alias=alias)
            if accepts is not None:
                # It may delete a row deferred earlier in this transaction.
                commits.doubt(transaction.get_connection(alias))
                row_id = strategy.supersede(message, accepts, alias=alias)
            return row_id

    def transaction_token(self, *, using: str | None = None) -> Hashable | None:
        """The alias's connection and its open savepoints; ``None`` outside an atomic block."""
        return token(alias_of(using))

    def add_many(
        self, messages: Sequence[NewMessage], *, using: str | None = None
    ) -> list[int | None]:
        """One multi-row upsert on PostgreSQL and SQLite 3.35+ (:mod:`~.bulk`); else one
        insert per row.
        """
        alias = alias_of(using)
        if not can_batch(alias):
            return super().add_many(messages, using=alias)
        with store_errors("write outbox rows"):
            return upsert_many(messages, alias=alias)

    def on_commit(self, callback: Callable[[], None], *, using: str | None = None) -> None:
        """``transaction.on_commit``: savepoint-aware; at once outside an atomic block."""
        transaction.on_commit(callback, using=alias_of(using))

    def awaits_commit(self, callback: Callable[[], None], *, using: str | None = None) -> bool:
        """Whether ``callback`` is still among the on-commit callbacks of ``using``'s open
        atomic block (under pytest-django's ``django_db``: the test's transaction).
        """
        connection = transaction.get_connection(alias_of(using))
        return connection.in_atomic_block and any(
            registered is callback for registered in on_commit_callbacks(connection)
        )

    def defer_publish(
        self, message: StoredMessage, publish: PublishCallback, *, using: str | None = None
    ) -> None:
        """Publish every row a transaction deferred in one callback (:mod:`~.batches`)."""
        batches.defer(message, publish, using=alias_of(using))

    def still_leased(
        self, messages: Sequence[StoredMessage], *, using: str | None = None
    ) -> set[int]:
        """One ``SELECT`` of the ids and leases; each row must hold its message's lease.

        No statement for the rows the commit whose callbacks are running is known to
        have written (:mod:`~django_outbox.store.transactions`): born leased, they are leased
        to no one else, since no one takes a row before its lease runs out.
        """
        alias = alias_of(using)
        committed = commits.committed_rows(alias)
        known = {m.id for m in messages if m.id in committed and m.locked_until is not None}
        unknown = [m for m in messages if m.id not in known]
        if not unknown:
            return known
        with store_errors("read outbox leases"):
            return known | strategy_for(alias).still_leased(unknown, alias=alias)

    # -- publishing and sweeping ----------------------------------------------------------
    def claim(
        self,
        ids: Iterable[int],
        *,
        now: datetime,
        lease_until: datetime,
        max_bytes: int | None = None,
        using: str | None = None,
    ) -> Claim:
        """Lease those of ``ids`` that are pending, due and unleased."""
        alias = alias_of(using)
        ids = list(ids)
        if not ids:
            return Claim(messages=(), lease_until=lease_until)
        with store_errors("claim outbox rows"):
            return strategy_for(alias).claim_ids(
                ids, now=now, lease_until=lease_until, max_bytes=max_bytes, alias=alias
            )

    def claim_due(
        self,
        *,
        now: datetime,
        created_before: datetime,
        limit: int,
        lease_until: datetime,
        max_bytes: int | None = None,
        using: str | None = None,
    ) -> Claim:
        """Lease up to ``limit`` due rows within ``max_bytes``, skipping locked rows."""
        alias = alias_of(using)
        refresh_connection(alias)
        with store_errors("claim outbox rows"):
            return strategy_for(alias).claim_due(
                now=now,
                created_before=created_before,
                limit=limit,
                lease_until=lease_until,
                max_bytes=max_bytes,
                alias=alias,
            )

    def mark_published(
        self,
        claim: Claim,
        ids: Sequence[int],
        *,
        now: datetime,
        keep: bool,
        using: str | None = None,
    ) -> int:
        """Delete (or mark ``published``) the still-leased rows of ``ids``: one statement."""
        alias = alias_of(using)
        if not ids:
            return 0
        strategy = strategy_for(alias)
        with store_errors("mark outbox rows published"):
            if keep:
                return strategy.keep_published(claim, ids, now=now, alias=alias)
            return strategy.delete_published(claim, ids, alias=alias)

    def record_failure(
        self,
        claim: Claim,
        ids: Sequence[int],
        *,
        error: str,
        retry_at: datetime | None,
        using: str | None = None,
    ) -> int:
        """Count a failed publish and release the rows: one ``UPDATE``."""
        alias = alias_of(using)
        if not ids:
            return 0
        with store_errors("record a failed publish"):
            return strategy_for(alias).record_failure(
                claim, ids, error=error, retry_at=retry_at, alias=alias
            )

    def cancel_pending(
        self,
        *,
        ids: Sequence[int] = (),
        task_ids: Sequence[str] = (),
        now: datetime,
        using: str | None = None,
    ) -> list[CancelledRow]:
        """Lock (``SELECT ... FOR UPDATE``), delete and close the workflows of the chosen
        pending rows, in ``transaction.atomic`` (the caller's transaction when open).
        """
        alias = alias_of(using)
        if not ids and not task_ids:
            return []
        chosen = Q(id__in=list(ids)) | Q(task_id__in=list(task_ids))
        with store_errors("cancel outbox rows"), transaction.atomic(using=alias):
            found = (
                messages(alias)
                .select_for_update()
                .filter(chosen, status=MessageStatus.PENDING.value)
                .order_by("id")
                .values_list("id", "task_id", "task_name", "options", "locked_until")
            )
            cancelled = [
                cancelled_row(pk, task_id, name, options, leased=lease is not None)
                for pk, task_id, name, options, lease in found
            ]
            if cancelled:
                # It may delete a row deferred earlier in this transaction, to publish on
                # commit: that publisher must read its rows back.
                commits.doubt(transaction.get_connection(alias))
                messages(alias).filter(id__in=[c.id for c in cancelled]).delete()
            for root in dict.fromkeys(c.root_id for c in cancelled):
                mark_cancelled(root, now=now, alias=alias)
        return cancelled

    def reset(self, ids: Iterable[int], *, now: datetime, using: str | None = None) -> int:
        """Make rows pending and due now; a failed row gets a fresh attempt budget."""
        alias = alias_of(using)
        ids = list(ids)
        if not ids:
            return 0
        with store_errors("reset outbox rows"):
            return strategy_for(alias).reset(ids, now=now, alias=alias)

    def sweep_aliases(self) -> Sequence[str | None]:
        """``DJANGO_OUTBOX_DATABASES``: the aliases the sweep task covers."""
        return list(settings.DATABASES)

    def count_by_status(self, *, using: str | None = None) -> Mapping[MessageStatus, int]:
        """Rows per status, every status present."""
        alias = alias_of(using)
        refresh_connection(alias)
        with store_errors("count outbox rows"):
            counts = messages(alias).counts_by_status()
        return {status: counts.get(status.value, 0) for status in MessageStatus}

    def oldest_pending(self, *, using: str | None = None) -> datetime | None:
        """``created_at`` of the oldest pending row."""
        alias = alias_of(using)
        refresh_connection(alias)
        with store_errors("read the oldest pending row"):
            return messages(alias).oldest_pending_created_at()

    def purge(
        self,
        *,
        statuses: Iterable[MessageStatus],
        older_than: datetime,
        limit: int,
        using: str | None = None,
    ) -> int:
        """Delete up to ``limit`` old rows in ``statuses``: two statements."""
        alias = alias_of(using)
        values = [MessageStatus(s).value for s in statuses]
        refresh_connection(alias)
        with store_errors("purge outbox rows"):
            return strategy_for(alias).purge(
                statuses=values, older_than=older_than, limit=limit, alias=alias
            )

    # -- deliveries --------------------------------------------------------------------
    def record_delivery(self, task_id: str, *, now: datetime, using: str | None = None) -> int:
        """Add one to the task's delivery count (2 on its first redelivery); committed."""
        with store_errors("count a redelivery"):
            return letters.record_delivery(task_id, now=now, alias=alias_of(using))

    def forget_deliveries(self, task_id: str, *, using: str | None = None) -> None:
        """Drop the task's delivery count (a no-op without one)."""
        with store_errors("clear a delivery count"):
            letters.forget_deliveries(task_id, alias=alias_of(using))

    # -- dead letters -------------------------------------------------------------------
    def add_dead_letter(
        self, letter: NewDeadLetter, *, using: str | None = None, workflow: str | None = None
    ) -> int:
        """Write a dead letter in the caller's transaction (at once outside one), and mark
        its ``workflow`` failed in the same transaction.
        """
        with store_errors("write a dead letter"):
            return letters.add_dead_letter(letter, alias=alias_of(using), workflow=workflow)

    def get_dead_letter(
        self, letter_id: int, *, using: str | None = None
    ) -> StoredDeadLetter | None:
        """The dead letter with that id, or ``None``."""
        with store_errors("read a dead letter"):
            return letters.get_dead_letter(letter_id, alias=alias_of(using))

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
        """Add ``message``, mark the letter ``requeued`` and resume its ``workflow``, in one
        transaction.
        """
        alias = alias_of(using)
        insert = functools.partial(strategy_for(alias).insert, alias=alias)
        with store_errors("requeue a dead letter"):
            return letters.requeue_dead_letter(
                letter_id, message, insert, by=by, now=now, alias=alias, workflow=workflow
            )

    def discard_dead_letter(self, letter_id: int, *, using: str | None = None) -> bool:
        """Mark a ``dead`` letter ``discarded``: one ``UPDATE``."""
        with store_errors("discard a dead letter"):
            return letters.discard_dead_letter(letter_id, alias=alias_of(using))

    def complete_dead_letters(self, task_id: str, *, using: str | None = None) -> int:
        """Mark the task's ``dead`` letters ``completed``: one ``UPDATE``."""
        with store_errors("complete a dead letter"):
            return letters.complete_dead_letters(task_id, alias=alias_of(using))
