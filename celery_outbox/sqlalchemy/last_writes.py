"""The last writes of an atomic run on SQLAlchemy: its result, its workflow count and
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
"""

from __future__ import annotations

import functools
from collections.abc import Iterator
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Executable,
    Table,
    Update,
    and_,
    bindparam,
    case,
    literal,
    select,
    update,
)
from sqlalchemy.dialects import postgresql
from sqlalchemy.orm import Session

from celery_outbox.records import MessageStatus, NewMessage, StoredMessage
from celery_outbox.sqlalchemy import inserts, transactions
from celery_outbox.sqlalchemy.types import UTCDateTime
from celery_outbox.storage import PublishCallback


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
    :func:`hold_insert` (PostgreSQL; ``None`` elsewhere: nothing is held)."""
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
    there is no such run in ``session`` (the caller counts it at once)."""
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
    there is no such run, one row is held already, or a savepoint is open."""
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
    after it), and defer its publish."""
    held = _held.get()
    if held is None or held.insert is None or held.conn is not conn:
        return
    row, held.insert = held.insert, None
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
    row: one statement."""
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
    reaching it, a running workflow succeeds."""
    c = table.c
    reaching = and_(c.status == "running", c.steps_done + 1 >= c.steps_total)
    now = bindparam("now", type_=UTCDateTime())
    # MySQL assigns left to right, each seeing the columns set before it: steps_done last,
    # and finished_at before status, so every CASE reads the row as it was.
    return (
        update(table)
        .where(c.root_id == bindparam("root"))
        .ordered_values(
            (c.finished_at, case((reaching, now), else_=c.finished_at)),
            (c.status, case((reaching, literal("succeeded")), else_=c.status)),
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
    (run once, to completion, though nothing reads it)."""
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
    ``NULL`` when a pending row has its task id."""
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
