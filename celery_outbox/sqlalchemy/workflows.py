"""Workflows and chord joins on SQLAlchemy: the ``Workflow`` rows and the join rows.

Every write runs in the caller's transaction (inside an atomic task, the task's
session), each concurrency-safe on its own: a workflow's steps are added by one upsert
(PostgreSQL and SQLite ``ON CONFLICT DO UPDATE``, MySQL/MariaDB ``ON DUPLICATE KEY
UPDATE``) and counted done by one ``UPDATE``; a chord header step locks its join row
(``SELECT ... FOR UPDATE``, a locking read, so a ``REPEATABLE READ`` snapshot never hides
another step's committed part; SQLite, which ignores ``FOR UPDATE``, takes its write
lock first) before writing its part.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping
from contextlib import AbstractContextManager
from dataclasses import fields
from datetime import datetime
from typing import Any

from sqlalchemy import (
    Connection,
    Engine,
    Executable,
    Table,
    and_,
    bindparam,
    delete,
    func,
    select,
    update,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.orm import Session

from celery_outbox.sqlalchemy import completions as last_writes
from celery_outbox.sqlalchemy.monitoring import bound_on, bounded_count
from celery_outbox.sqlalchemy.tables import OutboxTables
from celery_outbox.sqlalchemy.types import require_aware, store_errors
from celery_outbox.store.base import (
    WORKFLOW_STATUSES,
    JoinProgress,
    OutboxStore,
    StoredWorkflow,
)
from celery_outbox.store.counts import status_is
from celery_outbox.store.records import WorkflowStatus, empty_parts, part_results, with_part
from celery_outbox.store.transitions import CANCEL, FAIL, RESUME

_WORKFLOW_FIELDS = tuple(f.name for f in fields(StoredWorkflow))


class SQLAlchemyWorkflows(OutboxStore):
    """The workflow half of :class:`~celery_outbox.sqlalchemy.SQLAlchemyOutboxStore`."""

    engine: Engine
    tables: OutboxTables
    #: The caller's transaction (``SQLAlchemyOutboxStore._caller_transaction``).
    _caller_transaction: Callable[[], AbstractContextManager[Connection]]
    #: The caller's session in a transaction, or ``None``.
    _in_transaction: Callable[[], Session | None]

    def keeps_workflows(self) -> bool:
        """``True``: the tables hold workflows and chord joins."""
        return True

    def add_workflow_steps(
        self, root_id: str, *, name: str, steps: int, now: datetime, using: str | None = None
    ) -> None:
        require_aware(now=now)
        row = {"root_id": root_id, "name": name, "steps_total": steps, "created_at": now}
        with store_errors("count a workflow's steps"), self._caller_transaction() as conn:
            conn.execute(_add_steps(self.tables.workflow, conn.dialect.name), row)

    def workflow_step_done(self, root_id: str, *, now: datetime, using: str | None = None) -> None:
        require_aware(now=now)
        if last_writes.hold_step_count(self._in_transaction(), root_id, now):
            return  # written with the atomic run's result, in its transaction
        with store_errors("count a workflow step done"), self._caller_transaction() as conn:
            conn.execute(last_writes.step_done(self.tables.workflow), {"root": root_id, "now": now})

    def workflow_failed(
        self, root_id: str, task_id: str, *, now: datetime, using: str | None = None
    ) -> None:
        require_aware(now=now)
        with store_errors("mark a workflow failed"), self._caller_transaction() as conn:
            mark_failed(conn, self.tables.workflow, root_id, task_id, now=now)

    def workflow_cancelled(self, root_id: str, *, now: datetime, using: str | None = None) -> None:
        require_aware(now=now)
        with store_errors("cancel a workflow"), self._caller_transaction() as conn:
            mark_cancelled(conn, self.tables, root_id, now=now)

    def workflow_resumed(self, root_id: str, *, using: str | None = None) -> None:
        with store_errors("resume a workflow"), self._caller_transaction() as conn:
            mark_resumed(conn, self.tables.workflow, root_id)

    def get_workflow(self, root_id: str, *, using: str | None = None) -> StoredWorkflow | None:
        table = self.tables.workflow
        query = select(*(table.c[name] for name in _WORKFLOW_FIELDS))
        with store_errors("read a workflow"), self.engine.connect() as conn:
            found = conn.execute(query.where(table.c.root_id == root_id)).mappings().first()
        return None if found is None else StoredWorkflow(**found)

    def count_workflows(
        self, *, using: str | None = None, bound: int | None = None
    ) -> Mapping[WorkflowStatus, int]:
        # One count per status, each a range of the status index (read at every scrape):
        # a GROUP BY over the whole table is planned as a sequential scan.
        table = self.tables.workflow
        with store_errors("count workflows"), self.engine.connect() as conn:
            bound = bound_on(conn, bound)
            if bound is None:
                counts_of = [
                    select(func.count()).select_from(table).where(table.c.status == status)
                    for status in WORKFLOW_STATUSES
                ]
                query = select(*(count.scalar_subquery() for count in counts_of))
                counts = list(conn.execute(query).one())
            else:
                counts = [
                    bounded_count(conn, table, bound, status_is(s), table.c.status == s)
                    for s in WORKFLOW_STATUSES
                ]
        return {status: int(n) for status, n in zip(WORKFLOW_STATUSES, counts, strict=True)}

    def open_join(
        self, group_id: str, *, root_id: str, size: int, now: datetime, using: str | None = None
    ) -> None:
        require_aware(now=now)
        row = {
            "group_id": group_id,
            "root_id": root_id,
            "size": size,
            "remaining": size,
            "results": empty_parts(size),
            "created_at": now,
        }
        with store_errors("open a chord join"), self._caller_transaction() as conn:
            conn.execute(_open_join(self.tables.chord_join, conn.dialect.name), row)

    def join_part(
        self, group_id: str, index: int, result: str | None, *, using: str | None = None
    ) -> JoinProgress | None:
        with store_errors("count a chord header step"), self._caller_transaction() as conn:
            return _count_part(conn, self.tables.chord_join, group_id, index, result)

    def purge_joins(self, *, older_than: datetime, limit: int, using: str | None = None) -> int:
        require_aware(older_than=older_than)
        if limit < 1:
            return 0
        table = self.tables.chord_join
        done = and_(table.c.remaining == 0, table.c.created_at < older_than)
        oldest = select(table.c.id).where(done).order_by(table.c.created_at).limit(limit)
        with store_errors("purge chord joins"), self.engine.begin() as conn:
            ids = list(conn.execute(oldest).scalars())
            if not ids:
                return 0
            return conn.execute(delete(table).where(table.c.id.in_(ids))).rowcount


def mark_failed(
    conn: Connection, table: Table, root_id: str, task_id: str, *, now: datetime
) -> None:
    """Mark ``root_id``'s workflow failed by ``task_id`` unless it was cancelled (in
    ``conn``'s transaction).
    """
    stmt = update(table).where(table.c.root_id == root_id, table.c.status.in_(FAIL.sources))
    conn.execute(stmt.values(status=FAIL.target, failed_task_id=task_id, finished_at=now))


def mark_cancelled(conn: Connection, tables: OutboxTables, root_id: str, *, now: datetime) -> None:
    """Close ``root_id``'s running or failed workflow ``cancelled``, and then delete its
    chord joins (in ``conn``'s transaction).
    """
    table = tables.workflow
    stmt = update(table).where(table.c.root_id == root_id, table.c.status.in_(CANCEL.sources))
    if conn.execute(stmt.values(status=CANCEL.target, finished_at=now)).rowcount:
        joins = tables.chord_join
        conn.execute(delete(joins).where(joins.c.root_id == root_id))


def mark_resumed(conn: Connection, table: Table, root_id: str) -> None:
    """Put ``root_id``'s workflow back to running if it failed (in ``conn``'s transaction)."""
    stmt = update(table).where(table.c.root_id == root_id, table.c.status.in_(RESUME.sources))
    conn.execute(stmt.values(status=RESUME.target, finished_at=None))


def _count_part(
    conn: Connection, table: Table, group_id: str, index: int, result: str | None
) -> JoinProgress | None:
    """Lock the join, write header step ``index``'s part unless it is in, give the progress."""
    key = {"key": group_id}
    if conn.dialect.name == "sqlite":
        conn.execute(_touch_join(table), key)  # the write lock, held until the caller commits
    found = conn.execute(_lock_join(table), key).first()
    if found is None:
        return None
    parts = with_part(found.results, index, result)
    if parts is None:  # counted already
        return JoinProgress(remaining=found.remaining, results=part_results(found.results))
    remaining = found.remaining - 1
    conn.execute(_write_join(table), {**key, "remaining": remaining, "results": parts})
    return JoinProgress(remaining=remaining, results=part_results(parts))


# The statements below are built once per table (and dialect): a step pays for running
# them, not for building them.


@functools.lru_cache(maxsize=32)
def _add_steps(table: Table, dialect: str) -> Executable:
    """Insert a running workflow, or add its ``steps_total`` to the existing row's."""
    columns = ("root_id", "name", "steps_total", "created_at")
    row: dict[str, Any] = {name: bindparam(name) for name in columns}
    row.update(status="running", steps_done=0)
    total = table.c.steps_total
    if dialect in ("postgresql", "sqlite"):
        make = postgresql.insert if dialect == "postgresql" else sqlite.insert
        stmt = make(table).values(row)
        added = {"steps_total": total + stmt.excluded.steps_total}
        return stmt.on_conflict_do_update(index_elements=[table.c.root_id], set_=added)
    upsert = mysql.insert(table).values(row)
    return upsert.on_duplicate_key_update(steps_total=total + upsert.inserted.steps_total)


@functools.lru_cache(maxsize=32)
def _open_join(table: Table, dialect: str) -> Executable:
    """Insert a join unless its group id has one."""
    columns = ("group_id", "root_id", "size", "remaining", "results", "created_at")
    row: dict[str, Any] = {name: bindparam(name) for name in columns}
    if dialect in ("postgresql", "sqlite"):
        make = postgresql.insert if dialect == "postgresql" else sqlite.insert
        return make(table).values(row).on_conflict_do_nothing(index_elements=[table.c.group_id])
    # No INSERT IGNORE: it would also turn a too-long value into a warning.
    return mysql.insert(table).values(row).on_duplicate_key_update(group_id=table.c.group_id)


@functools.lru_cache(maxsize=32)
def _touch_join(table: Table) -> Executable:
    """A write changing nothing, for the lock it takes (SQLite has no ``FOR UPDATE``)."""
    c = table.c
    return update(table).where(c.group_id == bindparam("key")).values(remaining=c.remaining)


@functools.lru_cache(maxsize=32)
def _lock_join(table: Table) -> Executable:
    """Read the join's latest committed row and lock it until the caller's commit."""
    c = table.c
    return select(c.remaining, c.results).where(c.group_id == bindparam("key")).with_for_update()


@functools.lru_cache(maxsize=32)
def _write_join(table: Table) -> Executable:
    """Write the join's counter and parts."""
    c = table.c
    values: dict[str, Any] = {"remaining": bindparam("remaining"), "results": bindparam("results")}
    return update(table).where(c.group_id == bindparam("key")).values(values)
