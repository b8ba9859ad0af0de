"""``SQLAlchemyOutboxStore``: the outbox in any database SQLAlchemy speaks.

Batched dispatch in the SQLAlchemy store (:mod:`celery_outbox.dispatch.batching`).

A batch's rows go to the caller's session in one statement on PostgreSQL and SQLite
(:func:`~celery_outbox.sqlalchemy.statements.insert_many_pending`); MySQL/MariaDB, whose
multi-row ``INSERT`` fails whole on one pending task id, add them one by one. A task id
given twice in one batch is sent once: the first dispatch gets the row, as one by one.

The SQLAlchemy store's part in claiming ahead (:mod:`celery_outbox.store.base`).

Every claim of this store runs in a short transaction of its own on a connection of the
engine's pool, never in the caller's session, so a claim on another thread sees the same
committed rows. PostgreSQL only: its ``SKIP LOCKED`` claims are the ones measured
concurrent (:mod:`tests.integration.test_sweep`); the pool returns the claiming thread's
connection after each claim, so there is nothing to end.

The SQLAlchemy store's part in waking the relay (:mod:`celery_outbox.store.base`).

On PostgreSQL the LISTEN connection is a new connection of the engine's pool, detached
from it (the pool neither reuses nor recycles it); other dialects poll. The next parked
row's due time is one probe of the due-row index on every dialect.

``SQLAlchemyOutboxStore``: the outbox in any database SQLAlchemy speaks.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Hashable, Iterable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import TYPE_CHECKING, Any, TypeVar, Union

from sqlalchemy import Connection, Engine, delete, func, or_, select, type_coerce
from sqlalchemy.orm import Session, scoped_session

from celery_outbox.clock import Clock, utcnow
from celery_outbox.sqlalchemy import asynchronous, transactions
from celery_outbox.sqlalchemy import completions as last_writes
from celery_outbox.sqlalchemy import statements as claims
from celery_outbox.sqlalchemy import statements as inserts
from celery_outbox.sqlalchemy import statements as sql
from celery_outbox.sqlalchemy.completions import SQLAlchemyCompletions
from celery_outbox.sqlalchemy.letters import SQLAlchemyDeadLetters
from celery_outbox.sqlalchemy.monitoring import SQLAlchemyMonitoring
from celery_outbox.sqlalchemy.tables import OutboxTables, default_tables
from celery_outbox.sqlalchemy.types import UTCDateTime, require_aware, store_errors
from celery_outbox.sqlalchemy.workflows import SQLAlchemyWorkflows, mark_cancelled
from celery_outbox.store import published as published_rows
from celery_outbox.store.base import Connector, OutboxStore, PublishCallback, Supersedes
from celery_outbox.store.records import (
    CancelledRow,
    Claim,
    MessageStatus,
    NewMessage,
    StoredMessage,
    cancelled_row,
    message_columns,
)

if TYPE_CHECKING:
    from sqlalchemy.ext.asyncio import AsyncSession

#: A sync ``Session`` or an ``AsyncSession`` (see ``bind_session``).
_AnySession = TypeVar("_AnySession", bound=Union[Session, "AsyncSession"])
#: What a sync dispatch returns (see ``run_dispatch``).
_Result = TypeVar("_Result")

# --- Batched dispatch in the SQLAlchemy store (:mod:`celery_outbox.dispatch.batching`).

#: The dialects that take a batch in one statement.
_ONE_STATEMENT = ("postgresql", "sqlite")


class SQLAlchemyBulk(OutboxStore):
    """:class:`~celery_outbox.store.base.BulkStore` for ``SQLAlchemyOutboxStore``."""

    engine: Engine
    tables: OutboxTables

    if TYPE_CHECKING:

        def current_session(self) -> Session | None: ...
        def _caller_transaction(self) -> AbstractContextManager[Connection]: ...
        def now(self, *, using: str | None = None) -> datetime: ...

    def transaction_token(self, *, using: str | None = None) -> Hashable | None:
        """The session and its innermost open transaction (a savepoint's, nested);
        ``None`` when dispatches commit at once (no session in a transaction).
        """
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


# --- The SQLAlchemy store's part in claiming ahead (:mod:`celery_outbox.store.base`).


class SQLAlchemyClaimThreads(OutboxStore):
    """The claim-ahead half of :class:`~celery_outbox.sqlalchemy.SQLAlchemyOutboxStore`."""

    engine: Engine

    def claims_aside(self, using: str | None = None) -> bool:
        """On PostgreSQL."""
        return self.engine.dialect.name == "postgresql"


# --- The SQLAlchemy store's part in waking the relay (:mod:`celery_outbox.store.base`).


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


# --- ``SQLAlchemyOutboxStore``: the outbox in any database SQLAlchemy speaks.


class SQLAlchemyOutboxStore(
    SQLAlchemyCompletions,
    SQLAlchemyDeadLetters,
    SQLAlchemyWorkflows,
    SQLAlchemyMonitoring,
    SQLAlchemyWakeups,
    SQLAlchemyBulk,
    SQLAlchemyClaimThreads,
):
    """The outbox store for SQLAlchemy applications (Flask, FastAPI, scripts).

    Dispatches join the caller's ``Session`` transaction, found in this order: a
    session bound with :meth:`bind_session` in the current context; the current
    session of ``scoped_session`` if it is in a transaction; otherwise none, and the
    row is committed at once through ``engine``. The relay's work (claims, marks,
    failures) and maintenance use short transactions of their own on ``engine``.

    Parameters
    ----------
    engine
        The database holding the tables (create them with ``metadata.create_all`` or
        your migrations). Sessions bound to this store must write to the same database.
    scoped_session
        Optional ``scoped_session`` (Flask-SQLAlchemy's ``db.session``) whose current
        session receives dispatches made while it is in a transaction.
    tables
        Your own tables (:func:`~celery_outbox.sqlalchemy.define_tables` on your ``MetaData``).
    clock
        This host's clock, the database's on SQLite (a file on this host); on
        PostgreSQL and MySQL/MariaDB every time is the server's (:meth:`now`).
    """

    def __init__(
        self,
        *,
        engine: Engine,
        scoped_session: scoped_session[Any] | None = None,
        tables: OutboxTables | None = None,
        clock: Clock = utcnow,
    ) -> None:
        self.engine = engine
        transactions.watch_savepoints(engine)
        self.scoped_session = scoped_session
        self.tables = tables or default_tables
        self.clock = clock
        self._bound: ContextVar[Session | None] = ContextVar(
            f"celery_outbox_session_{id(self)}", default=None
        )
        self._published = published_rows.PublishedRows(self._delete_published)

    # -- the caller's transaction -------------------------------------------------
    @contextmanager
    def bind_session(self, session: _AnySession) -> Iterator[_AnySession]:
        """Within this block, dispatches in this context write to ``session``.

        The rows are part of the session's transaction (it begins one if needed) and
        are published after it commits; a rollback, or the rollback of the savepoint
        they were written in, discards them. An ``AsyncSession`` takes ``await
        task.adelay(...)``, and its commits publish off the event loop
        (:mod:`~celery_outbox.sqlalchemy.asynchronous`); one of another database than
        ``engine``'s is an :class:`~celery_outbox.exceptions.OutboxConfigError`.
        """
        bound: Session
        if isinstance(session, Session):
            bound = session
        else:
            bound = asynchronous.bind_async(self.engine, session, clause=self.tables.outbox)
        token = self._bound.set(bound)
        try:
            yield session
        finally:
            self._bound.reset(token)

    async def run_dispatch(self, dispatch: Callable[[], _Result]) -> _Result:
        """With an ``AsyncSession`` bound: inside its ``run_sync``, on its connection;
        otherwise in a worker thread, committing at once through ``engine``.
        """
        session = self._bound.get()
        bound = None if session is None else asynchronous.async_session_of(session)
        if bound is None:
            return await super().run_dispatch(dispatch)
        if self.now_reads():  # the database clock's round trip, off the loop
            await asyncio.to_thread(self.now)
        return await asynchronous.run_in_session(bound, dispatch)

    def current_session(self) -> Session | None:
        """The session dispatches write to now, or ``None`` (they commit at once)."""
        session = self._bound.get()
        if session is not None:
            asynchronous.check_usable(session)
            return session
        scoped = self.scoped_session
        current = scoped() if scoped is not None and scoped.registry.has() else None
        return current if current is not None and current.in_transaction() else None

    @contextmanager
    def _caller_transaction(self) -> Iterator[Connection]:
        session = self.current_session()
        if session is not None:
            yield session.connection(bind_arguments={"clause": self.tables.outbox})
            return
        with self.engine.begin() as conn:
            yield conn

    def _in_transaction(self) -> Session | None:
        return session if (session := self.current_session()) and session.in_transaction() else None

    @contextmanager
    def _single_statement(self) -> Iterator[Connection]:
        """A connection for one statement that is its own transaction: on PostgreSQL in
        autocommit (no ``BEGIN`` and ``COMMIT`` round trips), elsewhere a short one.
        """
        if self.engine.dialect.name == "postgresql":
            with self.engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
                yield conn
            return
        with self.engine.begin() as conn:
            yield conn

    # -- dispatch -------------------------------------------------------------------
    def add(
        self,
        message: NewMessage,
        *,
        using: str | None = None,
        supersedes: Supersedes | None = None,
    ) -> int | None:
        values = message_columns(message, created_at=self.now(using=using))
        with store_errors("add an outbox row"), self._caller_transaction() as conn:
            last_writes.write_held_insert(conn)  # a successor held for the end goes first
            return inserts.insert_pending(
                conn, self.tables.outbox, values, supersedes=supersedes, replaced=self._doubt_rows
            )

    def _doubt_rows(self) -> None:
        # A pending row was deleted in the caller's transaction: it may be one of its own.
        session = self._in_transaction()
        if session is not None:
            transactions.doubt_rows(session)

    def on_commit(self, callback: Callable[[], None], *, using: str | None = None) -> None:
        session = self._in_transaction()
        if session is None:
            callback()
        else:
            transactions.on_commit(session, callback)

    def awaits_commit(self, callback: Callable[[], None], *, using: str | None = None) -> bool:
        session = self._in_transaction()
        return session is not None and transactions.awaits(session, callback)

    def defer_publish(
        self, message: StoredMessage, publish: PublishCallback, *, using: str | None = None
    ) -> None:
        session = self._in_transaction()
        if session is None:
            publish((message,))
        else:
            connection = session.connection(bind_arguments={"clause": self.tables.outbox})
            transactions.defer_publish(session, message, publish, connection=connection)

    def still_leased(
        self, messages: Sequence[StoredMessage], *, using: str | None = None
    ) -> set[int]:
        """Also without a read: in the callbacks of the commit that wrote them, the rows
        it is known to have committed (no savepoint rolled back since they were written;
        see :mod:`~celery_outbox.sqlalchemy.transactions`), born leased, and leased to
        no one else, since no one takes a row before its lease runs out.
        """
        committed = transactions.committed_rows()
        known = {m.id for m in messages if m.id in committed and m.locked_until is not None}
        unknown = [m for m in messages if m.id not in known]
        if not unknown:
            return known
        with store_errors("read outbox leases"), self._single_statement() as conn:
            return known | sql.still_leased(conn, self.tables.outbox, unknown)

    # -- publishing and sweeping ----------------------------------------------------
    def claim(
        self,
        ids: Iterable[int],
        *,
        now: datetime,
        lease_until: datetime,
        max_bytes: int | None = None,
        using: str | None = None,
    ) -> Claim:
        require_aware(now=now, lease_until=lease_until)
        wanted = list(ids)
        if not wanted:
            return Claim(messages=(), lease_until=lease_until)
        candidates = sql.by_ids(self.tables.outbox, wanted, now)
        return self._lease(candidates, lease_until=lease_until, max_bytes=max_bytes)

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
        require_aware(now=now, created_before=created_before, lease_until=lease_until)
        candidates = sql.due_past_grace(self.tables.outbox, now, created_before, limit)
        return self._lease(candidates, lease_until=lease_until, max_bytes=max_bytes)

    def _lease(self, candidates: Any, *, lease_until: datetime, max_bytes: int | None) -> Claim:
        with store_errors("claim outbox rows"), self.engine.begin() as conn:
            messages = claims.lease(
                conn, self.tables.outbox, candidates, lease_until=lease_until, max_bytes=max_bytes
            )
        return Claim(messages=tuple(messages), lease_until=lease_until)

    def mark_published(
        self,
        claim: Claim,
        ids: Sequence[int],
        *,
        now: datetime,
        keep: bool,
        using: str | None = None,
    ) -> int:
        require_aware(now=now)
        if not ids:
            return 0
        if not keep and self._published.took(claim, ids, dialect=self.engine.dialect.name):
            return len(ids)
        with store_errors("mark outbox rows published"), self._single_statement() as conn:
            table = self.tables.outbox
            return sql.mark_published(conn, table, ids, claim.leases, now=now, keep=keep)

    def _delete_published(self, ids: Sequence[int], leases: Sequence[datetime]) -> None:
        with store_errors("delete published rows"), self._single_statement() as conn:
            sql.mark_published(conn, self.tables.outbox, ids, leases, now=utcnow(), keep=False)

    def record_failure(
        self,
        claim: Claim,
        ids: Sequence[int],
        *,
        error: str,
        retry_at: datetime | None,
        using: str | None = None,
    ) -> int:
        require_aware(retry_at=retry_at)
        if not ids:
            return 0
        where = sql.fenced(self.tables.outbox, ids, claim.leases)
        with store_errors("record a failed publish"), self.engine.begin() as conn:
            return sql.record_failure(
                conn,
                self.tables.outbox,
                where,
                error=error,
                retry_at=retry_at,
            )

    def cancel_pending(
        self,
        *,
        ids: Sequence[int] = (),
        task_ids: Sequence[str] = (),
        now: datetime,
        using: str | None = None,
    ) -> list[CancelledRow]:
        require_aware(now=now)
        if not ids and not task_ids:
            return []
        table = self.tables.outbox
        chosen = or_(table.c.id.in_(list(ids)), table.c.task_id.in_(list(task_ids)))
        query = (
            select(table.c.id, table.c.task_id, table.c.task_name, table.c.options)
            .add_columns(table.c.locked_until)
            .where(table.c.status == MessageStatus.PENDING.value, chosen)
            .order_by(table.c.id)
        )
        if self.engine.dialect.name != "sqlite":
            query = query.with_for_update()
        with store_errors("cancel outbox rows"), self._caller_transaction() as conn:
            found = conn.execute(query).all()
            cancelled = [
                cancelled_row(
                    r.id, r.task_id, r.task_name, r.options, leased=r.locked_until is not None
                )
                for r in found
            ]
            if cancelled:
                conn.execute(delete(table).where(table.c.id.in_([c.id for c in cancelled])))
            for root in dict.fromkeys(c.root_id for c in cancelled):
                mark_cancelled(conn, self.tables, root, now=now)
        if cancelled:
            self._doubt_rows()  # one may be a row this transaction wrote, to publish on commit
        return cancelled

    def reset(self, ids: Iterable[int], *, now: datetime, using: str | None = None) -> int:
        require_aware(now=now)
        wanted = list(ids)
        if not wanted:
            return 0
        with store_errors("reset outbox rows"), self.engine.begin() as conn:
            return sql.reset(conn, self.tables.outbox, wanted, now=now)

    def purge(
        self,
        *,
        statuses: Iterable[MessageStatus],
        older_than: datetime,
        limit: int,
        using: str | None = None,
    ) -> int:
        require_aware(older_than=older_than)
        values = [MessageStatus(s).value for s in statuses]
        if not values or limit < 1:
            return 0
        with store_errors("purge outbox rows"), self.engine.begin() as conn:
            return sql.purge(
                conn, self.tables.outbox, statuses=values, older_than=older_than, limit=limit
            )

    # -- deliveries -----------------------------------------------------------------
    def record_delivery(self, task_id: str, *, now: datetime, using: str | None = None) -> int:
        require_aware(now=now)
        with store_errors("count a delivery"), self.engine.begin() as conn:
            return sql.record_delivery(conn, self.tables.delivery, task_id, now=now)

    def forget_deliveries(self, task_id: str, *, using: str | None = None) -> None:
        with store_errors("forget deliveries"), self.engine.begin() as conn:
            sql.forget_deliveries(conn, self.tables.delivery, task_id)
