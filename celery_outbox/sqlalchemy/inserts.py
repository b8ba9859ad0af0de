"""Inserting an outbox row: the one-pending-row-per-task-id key, and superseding.

``INSERT ... ON CONFLICT (task_id) WHERE status = 'pending' DO NOTHING`` on PostgreSQL
and SQLite, where the partial unique index decides atomically without aborting the
caller's transaction. On MySQL/MariaDB a plain ``INSERT``: the unique key over the
generated ``pending_task_id`` (:mod:`celery_outbox.pending_key`) decides as atomically
(after a ``SELECT`` that keeps tables created before the key idempotent but racy), and its
duplicate-key error, which rolls back that statement only, means "already pending".
A pending row that the core's rule supersedes (:mod:`celery_outbox.superseding`) is
locked, deleted while still pending and replaced, in the same transaction.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from sqlalchemy import (
    Connection,
    CursorResult,
    Executable,
    Table,
    delete,
    insert,
    literal,
    literal_column,
    select,
)
from sqlalchemy.dialects import postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from celery_outbox.pending_key import is_pending_duplicate
from celery_outbox.records import MessageStatus, StoredMessage
from celery_outbox.rows import stored_message

PENDING = MessageStatus.PENDING.value


def insert_pending(
    conn: Connection,
    table: Table,
    values: Mapping[str, Any],
    *,
    supersedes: Callable[[StoredMessage], bool] | None = None,
    replaced: Callable[[], None] | None = None,
) -> int | None:
    """Insert a pending row unless one with its ``task_id`` exists that ``supersedes``
    (when given) does not accept; its id, or ``None``. ``replaced`` is called when a
    pending row was deleted to make room."""
    found = _insert_pending(conn, table, values)
    if found is None and supersedes is not None:
        return _supersede_pending(conn, table, values, supersedes, replaced)
    return found


def _insert_pending(conn: Connection, table: Table, values: Mapping[str, Any]) -> int | None:
    dialect = conn.dialect.name
    if dialect in ("postgresql", "sqlite"):
        # The partial unique index decides, atomically, without aborting the
        # caller's transaction on a duplicate.
        found: int | None = conn.execute(
            _insert_unless_pending(table, dialect), dict(values)
        ).scalar_one_or_none()
        return found
    # MySQL/MariaDB: a pending row of this id, committed or this transaction's, is found
    # first (a table created before the key had it checked only so); the unique key over
    # the generated pending_task_id decides between concurrent transactions, and its
    # duplicate-key error rolls back this statement only, never the caller's transaction.
    # A literal, not a parameter, as in the statements of the other databases.
    pending = table.c.status == literal_column(f"'{PENDING}'")
    duplicate = select(table.c.id).where(table.c.task_id == values["task_id"], pending)
    if conn.execute(duplicate.limit(1)).first() is not None:
        return None
    try:
        return inserted_id(conn.execute(insert(table).values(values)))
    except IntegrityError as error:
        if is_pending_duplicate(error):
            return None
        raise


@functools.lru_cache(maxsize=32)
def _insert_unless_pending(table: Table, dialect: str) -> Executable:
    """``INSERT ... ON CONFLICT (task_id) WHERE status = 'pending' DO NOTHING RETURNING
    id``, built once per table and dialect; the row's values are its parameters."""
    # The index predicate is rendered inline: a bound parameter cannot be matched
    # to the partial index once psycopg prepares the statement (5th execution).
    inline = table.c.status == literal(PENDING, literal_execute=True)
    make = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return (
        make(table)
        .on_conflict_do_nothing(index_elements=[table.c.task_id], index_where=inline)
        .returning(table.c.id)
    )


def _supersede_pending(
    conn: Connection,
    table: Table,
    values: Mapping[str, Any],
    supersedes: Callable[[StoredMessage], bool],
    replaced: Callable[[], None] | None,
) -> int | None:
    """Replace the pending row of ``values``' task id when ``supersedes`` accepts it: the
    row is locked, deleted while still pending, and ``values`` inserted; the new id, or
    ``None`` (nothing written) when a pending row stays."""
    c = table.c
    pending = (
        conn.execute(
            select(table)
            .where(c.task_id == values["task_id"], c.status == PENDING)
            .with_for_update()
        )
        .mappings()
        .first()
    )
    if pending is not None:
        if not supersedes(stored_message(pending)):
            return None
        conn.execute(delete(table).where(c.id == pending["id"], c.status == PENDING))
        if replaced is not None:
            replaced()
    return _insert_pending(conn, table, values)


def inserted_id(result: CursorResult[Any]) -> int:
    """The primary key of the row an ``INSERT`` wrote."""
    key = result.inserted_primary_key
    if key is None:  # pragma: no cover - every insert here writes one row
        raise RuntimeError("celery-outbox: the INSERT returned no primary key.")
    return int(key[0])


def insert_many_pending(
    conn: Connection, table: Table, rows: Sequence[Mapping[str, Any]]
) -> dict[str, int]:
    """PostgreSQL, SQLite: insert ``rows`` (distinct task ids) in one multi-row statement
    (SQLAlchemy's "insertmanyvalues"), skipping those whose task id is already pending;
    the id of each row written, by task id (a task id has at most one pending row)."""
    stmt = _insert_many_unless_pending(table, conn.dialect.name)
    return {str(task_id): int(row_id) for row_id, task_id in conn.execute(stmt, list(rows))}


@functools.lru_cache(maxsize=32)
def _insert_many_unless_pending(table: Table, dialect: str) -> Executable:
    # A literal in the SQL (executemany takes no literal_execute parameter).
    inline = table.c.status == literal_column(f"'{PENDING}'")
    make = postgresql.insert if dialect == "postgresql" else sqlite.insert
    return (
        make(table)
        .on_conflict_do_nothing(index_elements=[table.c.task_id], index_where=inline)
        .returning(table.c.id, table.c.task_id)
    )
