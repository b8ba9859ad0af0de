"""Atomic tasks on SQLAlchemy: the ``CompletedTask`` rows, and the session of the run.

:meth:`SQLAlchemyCompletions.complete_once` opens a ``Session`` on the store's engine,
inserts the task's row first (PostgreSQL and SQLite ``ON CONFLICT DO NOTHING``;
MySQL/MariaDB an ``INSERT`` in a savepoint, whose duplicate-key error is the answer),
binds the session to the store for the block (dispatches join it) and to
:func:`atomic_session` (the body writes through it), then writes the result (with the
workflow count: :mod:`~celery_outbox.sqlalchemy.last_writes`) and commits.
A concurrent duplicate's insert waits on the unique key until the first run ends.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Executable,
    Table,
    bindparam,
    delete,
    func,
    insert,
    select,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from celery_outbox import published_rows
from celery_outbox.completions import Completion
from celery_outbox.exceptions import StoreError
from celery_outbox.records import NewMessage, StoredCompletion, StoredMessage
from celery_outbox.rows import message_columns
from celery_outbox.sqlalchemy import last_writes
from celery_outbox.sqlalchemy.boundary import require_aware, store_errors
from celery_outbox.sqlalchemy.tables import OutboxTables
from celery_outbox.storage import OutboxStore

_session: ContextVar[Session | None] = ContextVar("celery_outbox_atomic_session", default=None)


def atomic_session() -> Session:
    """The ``Session`` of the atomic task running in this context: write through it, and
    the writes commit with the task's ``CompletedTask`` row (or roll back with it).

    Raises
    ------
    RuntimeError
        Outside the body of an atomic ``OutboxTask`` run by a worker.
    """
    session = _session.get()
    if session is None:
        raise RuntimeError(
            "celery-outbox: atomic_session() is only available inside the body of an atomic "
            "OutboxTask (atomic=True) run by a worker on the SQLAlchemy store."
        )
    return session


class SQLAlchemyCompletions(OutboxStore):
    """The atomic-task half of :class:`~celery_outbox.sqlalchemy.SQLAlchemyOutboxStore`."""

    engine: Engine
    tables: OutboxTables
    bind_session: Any
    current_session: Callable[[], Session | None]
    now: Callable[..., datetime]

    def atomic_problem(self, using: str | None = None) -> str | None:
        """``None``: every database SQLAlchemy speaks has transactions and unique keys."""
        return None

    @contextmanager
    def complete_once(
        self,
        task_id: str,
        task_name: str,
        *,
        now: datetime,
        using: str | None = None,
        root_id: str | None = None,
    ) -> Iterator[Completion]:
        require_aware(now=now)
        table = self.tables.completed
        with Session(self.engine) as session:
            with store_errors("start an atomic task"):
                conn = session.connection(bind_arguments={"clause": table})
                row = {
                    "task_id": task_id,
                    "task_name": task_name,
                    "completed_at": now,
                    "root_id": root_id,
                }
                previous = _claim_key(conn, table, row)
            completion = Completion(task_id, task_name, previous=previous)
            if previous is not None:
                session.rollback()
                yield completion
                return
            token = _session.set(session)
            try:
                with (
                    self.bind_session(session),
                    last_writes.holding(session, conn) as held,
                ):
                    yield completion
                with store_errors("complete an atomic task"):
                    last_writes.write_last(
                        conn,
                        completed=table,
                        workflow=self.tables.workflow,
                        held=held,
                        task_id=task_id,
                        result=completion.result,
                    )
                    with published_rows.deferring():  # what it hands on is deleted later
                        session.commit()
            except BaseException:
                session.rollback()
                raise
            finally:
                _session.reset(token)

    def hand_on(
        self,
        message: NewMessage,
        publish: Callable[[Sequence[StoredMessage]], object],
        *,
        using: str | None = None,
    ) -> bool:
        """On PostgreSQL, inside :meth:`complete_once` and its session (no savepoint open):
        the row is written by the run's last statement
        (:mod:`~celery_outbox.sqlalchemy.last_writes`)."""
        session = self.current_session()
        if session is None:
            return False
        values = message_columns(message, created_at=self.now(using=using))
        return last_writes.hold_insert(session, self.tables.outbox, values, message, publish)

    def completion(self, task_id: str, *, using: str | None = None) -> StoredCompletion | None:
        with store_errors("read a completed task"), self.engine.connect() as conn:
            return _read(conn, self.tables.completed, task_id, lock=False)

    def count_completed(self, *, using: str | None = None) -> int:
        table = self.tables.completed
        with store_errors("count completed tasks"), self.engine.connect() as conn:
            return int(conn.execute(select(func.count()).select_from(table)).scalar_one())

    def purge_completed(self, *, older_than: datetime, limit: int, using: str | None = None) -> int:
        require_aware(older_than=older_than)
        if limit < 1:
            return 0
        table = self.tables.completed
        oldest = (
            select(table.c.id)
            .where(table.c.completed_at < older_than)
            .order_by(table.c.completed_at)
            .limit(limit)
        )
        with store_errors("purge completed tasks"), self.engine.begin() as conn:
            ids = list(conn.execute(oldest).scalars())
            if not ids:
                return 0
            return conn.execute(delete(table).where(table.c.id.in_(ids))).rowcount


def _claim_key(conn: Connection, table: Table, row: Mapping[str, Any]) -> StoredCompletion | None:
    """Insert the run's row: ``None`` when it was written, else the earlier run's row."""
    for _ in range(2):  # a row purged between the insert and the read: insert again
        if _insert(conn, table, row):
            return None
        previous = _read(conn, table, row["task_id"])
        if previous is not None:
            return previous
    raise StoreError(f"celery-outbox could not key the atomic task {row['task_id']!r}.")


@functools.lru_cache(maxsize=32)
def _insert_or_nothing(table: Table, dialect: str) -> Executable:
    """``INSERT ... ON CONFLICT (task_id) DO NOTHING RETURNING id``, built once per table
    and dialect (an atomic run pays for executing it, not for building it)."""
    make = postgresql.insert if dialect == "postgresql" else sqlite.insert
    stmt = make(table).values({name: bindparam(name) for name in _KEY_COLUMNS})
    return stmt.on_conflict_do_nothing(index_elements=[table.c.task_id]).returning(table.c.id)


#: The columns of a new row (``result`` is written at the end, when there is one).
_KEY_COLUMNS = ("task_id", "task_name", "completed_at", "root_id")


def _insert(conn: Connection, table: Table, row: Mapping[str, Any]) -> bool:
    """Insert ``row`` unless its task id has one (waiting on a concurrent insert of it)."""
    dialect = conn.dialect.name
    if dialect in ("postgresql", "sqlite"):
        return conn.execute(_insert_or_nothing(table, dialect), dict(row)).first() is not None
    savepoint = conn.begin_nested()  # MySQL/MariaDB: a duplicate key error ends only this
    try:
        conn.execute(insert(table).values(row))
    except sa_exc.IntegrityError:
        savepoint.rollback()
        return False
    savepoint.commit()
    return True


def _read(
    conn: Connection, table: Table, task_id: str, *, lock: bool = True
) -> StoredCompletion | None:
    c = table.c
    query = select(c.task_name, c.completed_at, c.result, c.root_id).where(c.task_id == task_id)
    if lock:  # a locking read sees the latest commit, under REPEATABLE READ too
        query = query.with_for_update(read=True)
    found = conn.execute(query).first()
    if found is None:
        return None
    return StoredCompletion(
        task_id=task_id,
        task_name=found.task_name,
        completed_at=found.completed_at,
        result=found.result,
        root_id=found.root_id,
    )
