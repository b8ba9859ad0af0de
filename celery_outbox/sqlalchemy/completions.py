"""Atomic tasks on SQLAlchemy: CompletedTask rows and the run's last writes.

The last writes of an atomic run on SQLAlchemy: its result, its workflow count and
the successor it hands on.

An atomic step's transaction ends with two ``UPDATE`` s that return nothing: the
``CompletedTask`` result and the ``Workflow`` step count. On PostgreSQL they are sent as
one statement (the count in a data-modifying ``WITH``), a round trip fewer per step: the
count asked for in the run's own session is held (:func:`hold_step_count`) and written
with the result, in the same transaction, after everything else the step wrote. Other
dialects run the count when it is asked for.

On PostgreSQL the successor the step hands on (:func:`hold_insert`, one per run) rides on
that statement too: its outbox ``INSERT ... ON CONFLICT DO NOTHING`` is one more
data-modifying ``WITH``, whose id the statement returns, and its publish is deferred then,
before the commit (nothing when the row was not written). Any other outbox row the run
writes after it first writes the held one (:func:`write_held_insert`), so rows are written
in the order they were dispatched. A savepoint open at that point keeps the row out (its
rollback must take the row along).

Atomic tasks on SQLAlchemy: the ``CompletedTask`` rows, and the session of the run.

:meth:`SQLAlchemyCompletions.complete_once` opens a ``Session`` on the store's engine,
inserts the task's row first (PostgreSQL and SQLite ``ON CONFLICT DO NOTHING``;
MySQL/MariaDB an ``INSERT`` in a savepoint, whose duplicate-key error is the answer),
binds the session to the store for the block (dispatches join it) and to
:func:`atomic_session` (the body writes through it), then writes the result (with the
workflow count: :mod:`~celery_outbox.sqlalchemy.completions`) and commits.
A concurrent duplicate's insert waits on the unique key until the first run ends.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Executable,
    Table,
    Update,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal,
    select,
    update,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.orm import Session

from celery_outbox.exceptions import StoreError
from celery_outbox.sqlalchemy import statements as inserts
from celery_outbox.sqlalchemy import transactions
from celery_outbox.sqlalchemy.tables import OutboxTables
from celery_outbox.sqlalchemy.types import UTCDateTime, require_aware, store_errors
from celery_outbox.store import published as published_rows
from celery_outbox.store.base import Completion, OutboxStore, PublishCallback
from celery_outbox.store.records import (
    MessageStatus,
    NewMessage,
    StoredCompletion,
    StoredMessage,
    message_columns,
)
from celery_outbox.store.transitions import SUCCEED

# --- The last writes of an atomic run on SQLAlchemy: its result, its workflow count and


@dataclass
class _Insert:
    """An outbox row held for the last statement, and the publisher it is deferred to."""

    table: Table
    values: dict[str, Any]
    message: NewMessage
    publish: PublishCallback


@dataclass
class _Held:
    session: Session
    #: The workflow count held for the end: ``(root_id, now)``.
    step: tuple[str, datetime] | None = None
    #: The connection of the run's last statement (set by :func:`holding`).
    conn: Connection | None = None
    #: The successor's outbox row held for the end.
    insert: _Insert | None = None


_held: ContextVar[_Held | None] = ContextVar("celery_outbox_held_writes", default=None)


@contextmanager
def holding(session: Session, conn: Connection) -> Iterator[_Held | None]:
    """Within the block, a workflow count asked for in ``session`` (on ``conn``, its
    connection) waits for :func:`write_last`, as does a successor's outbox row given to
    :func:`hold_insert` (PostgreSQL; ``None`` elsewhere: nothing is held).
    """
    if conn.dialect.name != "postgresql":
        yield None
        return
    held = _Held(session, conn=conn)
    token = _held.set(held)
    try:
        yield held
    finally:
        _held.reset(token)


def hold_step_count(session: Session | None, root_id: str, now: datetime) -> bool:
    """Hold one step of workflow ``root_id`` for the run's last write; ``False`` when
    there is no such run in ``session`` (the caller counts it at once).
    """
    held = _held.get()
    if held is None or session is None or held.session is not session or held.step is not None:
        return False
    held.step = (root_id, now)
    return True


def hold_insert(
    session: Session | None,
    table: Table,
    values: dict[str, Any],
    message: NewMessage,
    publish: PublishCallback,
) -> bool:
    """Hold the outbox row ``values`` of ``message`` (``table``: on the run's connection)
    for the last statement of the run in ``session``, and its publish; ``False`` when
    there is no such run, one row is held already, or a savepoint is open.
    """
    held = _held.get()
    if held is None or session is None or held.session is not session or held.insert is not None:
        return False
    if session.get_nested_transaction() is not None:
        return False
    if session.connection(bind_arguments={"clause": table}) is not held.conn:
        return False
    held.insert = _Insert(table, values, message, publish)
    return True


def write_held_insert(conn: Connection) -> None:
    """Write the row held on ``conn`` now, if any (another outbox row is being written
    after it), and defer its publish.
    """
    held = _held.get()
    if held is None or held.insert is None or held.conn is not conn:
        return
    row = held.insert
    held.insert = None
    _defer(held.session, conn, row, inserts.insert_pending(conn, row.table, row.values))


def _defer(session: Session, conn: Connection, row: _Insert, row_id: int | None) -> None:
    if row_id is not None:
        message = StoredMessage.written(row.message, row_id)
        transactions.defer_publish(session, message, row.publish, connection=conn)


def write_last(
    conn: Connection,
    *,
    completed: Table,
    workflow: Table,
    held: _Held | None,
    task_id: str,
    result: str | None,
) -> None:
    """The run's result (when it has one), its held workflow count and its held outbox
    row: one statement.
    """
    step = held.step if held is not None else None
    row = held.insert if held is not None else None
    if held is not None and row is not None:
        held.insert = None
        params = {f"{_ROW}{name}": value for name, value in row.values.items()}
        if step is not None:
            params.update(root=step[0], now=step[1])
        if result is not None:
            params.update(task=task_id, result=result)
        stmt = _with_insert(
            row.table,
            tuple(row.values),
            completed if result is not None else None,
            workflow if step is not None else None,
        )
        _defer(held.session, conn, row, conn.execute(stmt, params).scalar())
    elif step is not None:
        count = {"root": step[0], "now": step[1]}
        if result is not None:
            values = {**count, "task": task_id, "result": result}
            conn.execute(_result_and_step(completed, workflow), values)
        else:
            conn.execute(step_done(workflow), count)
    elif result is not None:
        conn.execute(_set_result(completed), {"task": task_id, "result": result})


@functools.lru_cache(maxsize=32)
def step_done(table: Table) -> Update:
    """One more step of workflow ``:root`` done at ``:now``, never past the total;
    reaching it, a running workflow succeeds.
    """
    c = table.c
    reaching = and_(c.status.in_(SUCCEED.sources), c.steps_done + 1 >= c.steps_total)
    now = bindparam("now", type_=UTCDateTime())
    # MySQL assigns left to right, each seeing the columns set before it: steps_done last,
    # and finished_at before status, so every CASE reads the row as it was.
    return (
        update(table)
        .where(c.root_id == bindparam("root"))
        .ordered_values(
            (c.finished_at, case((reaching, now), else_=c.finished_at)),
            (c.status, case((reaching, literal(SUCCEED.target)), else_=c.status)),
            (
                c.steps_done,
                case((c.steps_done < c.steps_total, c.steps_done + 1), else_=c.steps_done),
            ),
        )
    )


@functools.lru_cache(maxsize=32)
def _set_result(table: Table) -> Update:
    """``UPDATE ... SET result = :result WHERE task_id = :task``."""
    key = table.c.task_id == bindparam("task")
    return update(table).where(key).values(result=bindparam("result"))


@functools.lru_cache(maxsize=32)
def _result_and_step(completed: Table, workflow: Table) -> Executable:
    """PostgreSQL: the result ``UPDATE`` with the step count as a data-modifying ``WITH``
    (run once, to completion, though nothing reads it).
    """
    count = step_done(workflow).cte("celery_outbox_step_done")
    return _set_result(completed).add_cte(count)


#: The prefix of the held row's parameters in the last statement.
_ROW = "outbox_"


@functools.lru_cache(maxsize=64)
def _with_insert(
    outbox: Table, columns: tuple[str, ...], completed: Table | None, workflow: Table | None
) -> Executable:
    """PostgreSQL: ``WITH`` the outbox row's ``INSERT ... ON CONFLICT DO NOTHING RETURNING
    id`` (parameters ``outbox_<column>``), the step count and the result (when given, as
    data-modifying ``WITH`` s: each run once, to completion) ``SELECT`` the new row's id,
    ``NULL`` when a pending row has its task id.
    """
    values = {name: bindparam(f"{_ROW}{name}", type_=outbox.c[name].type) for name in columns}
    pending = outbox.c.status == literal(MessageStatus.PENDING.value, literal_execute=True)
    insert = (
        postgresql.insert(outbox)
        .values(values)
        .on_conflict_do_nothing(index_elements=[outbox.c.task_id], index_where=pending)
        .returning(outbox.c.id)
        .cte("celery_outbox_handed_on")
    )
    stmt = select(select(insert.c.id).scalar_subquery())
    if workflow is not None:
        stmt = stmt.add_cte(step_done(workflow).cte("celery_outbox_step_done"))
    if completed is not None:
        stmt = stmt.add_cte(_set_result(completed).cte("celery_outbox_result"))
    return stmt


# --- Atomic tasks on SQLAlchemy: the ``CompletedTask`` rows, and the session of the run.

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
                    holding(session, conn) as held,
                ):
                    yield completion
                with store_errors("complete an atomic task"):
                    write_last(
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
        (:mod:`~celery_outbox.sqlalchemy.completions`).
        """
        session = self.current_session()
        if session is None:
            return False
        values = message_columns(message, created_at=self.now(using=using))
        return hold_insert(session, self.tables.outbox, values, message, publish)

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
    and dialect (an atomic run pays for executing it, not for building it).
    """
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
