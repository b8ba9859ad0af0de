"""The SQL of the store, built with SQLAlchemy Core and portable across dialects.

Each function takes a ``Connection`` (in whatever transaction the store chose) and
runs a bounded number of statements. Dialect differences are kept here (and, for the
insert of a pending row, in :mod:`~celery_outbox.sqlalchemy.inserts`): ``UPDATE ...
RETURNING`` versus ``SELECT ... FOR UPDATE`` then ``UPDATE``, and assignment order
(MySQL evaluates ``SET`` left to right with the new values, so every expression
reading a column comes before that column's own assignment).
"""

from __future__ import annotations

import functools
from collections.abc import Iterable, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    ColumnElement,
    Connection,
    Executable,
    Select,
    Table,
    and_,
    bindparam,
    case,
    delete,
    func,
    literal,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite

from celery_outbox.records import MessageStatus, StoredMessage

PENDING = MessageStatus.PENDING.value
FAILED = MessageStatus.FAILED.value
PUBLISHED = MessageStatus.PUBLISHED.value


def due(table: Table, now: datetime) -> ColumnElement[bool]:
    """Pending, due at ``now`` and not leased by anyone."""
    c = table.c
    return and_(
        c.status == PENDING,
        c.available_at <= now,
        or_(c.locked_until.is_(None), c.locked_until <= now),
    )


def by_ids(table: Table, ids: Sequence[int], now: datetime) -> Select[Any]:
    """The rows of ``ids`` a claim may take at ``now``, oldest due first."""
    c = table.c
    return select(table).where(c.id.in_(ids), due(table, now)).order_by(c.available_at, c.id)


def due_past_grace(
    table: Table, now: datetime, created_before: datetime, limit: int
) -> Select[Any]:
    """Up to ``limit`` rows a sweep may claim at ``now``, oldest due first."""
    c = table.c
    where = and_(due(table, now), past_grace(table, created_before))
    # The due index's order (ties: the index's): on PostgreSQL, whose index entries do not
    # end with the id, ordering by (available_at, id) sorted every row due at the same
    # instant (a backlog written at once) on every claim.
    return select(table).where(where).order_by(c.available_at).limit(limit)


def oldest_pending(conn: Connection, table: Table) -> datetime | None:
    """``created_at`` of the oldest pending row, or ``None``."""
    c = table.c
    stmt = select(c.created_at).where(c.status == PENDING).order_by(c.created_at).limit(1)
    oldest: datetime | None = conn.execute(stmt).scalar()
    return oldest


def past_grace(table: Table, created_before: datetime) -> ColumnElement[bool]:
    """Created before ``created_before``, or parked (due after it was created): rows no
    on-commit publisher may still hold."""
    c = table.c
    return or_(c.created_at <= created_before, c.available_at > c.created_at)


def fenced(table: Table, ids: Sequence[int], leases: Iterable[datetime]) -> ColumnElement[bool]:
    """The claimed rows in ``ids`` whose lease is still one of ``leases``."""
    c = table.c
    return and_(c.id.in_(ids), c.locked_until.in_(list(leases)), c.status == PENDING)


def committing_asynchronously(where: ColumnElement[bool]) -> ColumnElement[bool]:
    """``where``, and (PostgreSQL) ``synchronous_commit`` off for this statement's own
    transaction, evaluated once before any row is touched: deleting published rows need
    not wait for the WAL flush (a delete lost in a database crash only publishes the
    rows again)."""
    setting = select(func.set_config("synchronous_commit", "off", True)).scalar_subquery()
    return and_(where, setting.is_not(None))


def still_leased(conn: Connection, table: Table, messages: Sequence[StoredMessage]) -> set[int]:
    """The ids of ``messages`` whose row is pending and holds the message's own lease."""
    rows = conn.execute(_leases_of(table), {"ids": [m.id for m in messages]})
    leases = {row_id: lease for row_id, lease in rows}
    return {
        m.id for m in messages if m.locked_until is not None and leases.get(m.id) == m.locked_until
    }


def mark_published(
    conn: Connection,
    table: Table,
    ids: Sequence[int],
    leases: Iterable[datetime],
    *,
    now: datetime,
    keep: bool,
) -> int:
    """Delete the rows of ``ids`` still holding one of ``leases`` (the fence), or with
    ``keep`` mark them ``published``; how many changed. On PostgreSQL a delete does not
    wait for the WAL flush (:func:`committing_asynchronously`)."""
    params: dict[str, Any] = {"ids": list(ids), "leases": list(leases)}
    if keep:
        return conn.execute(_mark_published(table), {**params, "now": now}).rowcount
    asynchronous = conn.dialect.name == "postgresql"
    return conn.execute(_delete_published(table, asynchronous), params).rowcount


# The statements of the on-commit path, built once per table (a publish pays for
# executing them, not for building them and their cache keys).
@functools.lru_cache(maxsize=32)
def _leases_of(table: Table) -> Executable:
    c = table.c
    return select(c.id, c.locked_until).where(
        c.id.in_(bindparam("ids", expanding=True)), c.status == PENDING
    )


def _fenced_by_params(table: Table) -> ColumnElement[bool]:
    c = table.c
    return and_(
        c.id.in_(bindparam("ids", expanding=True)),
        c.locked_until.in_(bindparam("leases", expanding=True)),
        c.status == PENDING,
    )


@functools.lru_cache(maxsize=32)
def _delete_published(table: Table, asynchronous: bool) -> Executable:
    where = _fenced_by_params(table)
    return delete(table).where(committing_asynchronously(where) if asynchronous else where)


@functools.lru_cache(maxsize=32)
def _mark_published(table: Table) -> Executable:
    now = bindparam("now", type_=table.c.published_at.type)
    values = {"status": PUBLISHED, "published_at": now, "locked_until": None}
    return update(table).where(_fenced_by_params(table)).values(values)


def record_failure(
    conn: Connection,
    table: Table,
    where: ColumnElement[bool],
    *,
    error: str,
    retry_at: datetime | None,
) -> int:
    """Count one failed attempt and release the rows (``failed`` without ``retry_at``);
    how many changed."""
    c = table.c
    status: Any = FAILED
    available_at: Any = c.available_at  # a failed row keeps its due time
    if retry_at is not None:
        status = PENDING
        available_at = literal(retry_at, type_=c.available_at.type)
    stmt = (
        update(table)
        .where(where)
        .ordered_values(
            (c.status, status),
            (c.available_at, available_at),
            (c.last_error, error),
            (c.locked_until, None),
            (c.attempts, c.attempts + 1),
        )
    )
    return conn.execute(stmt).rowcount


def reset(conn: Connection, table: Table, ids: Iterable[int], *, now: datetime) -> int:
    """Make rows pending and due now (see ``OutboxStore.reset``); how many changed."""
    c = table.c
    rows = conn.execute(
        select(c.id, c.task_id, c.status)
        .where(c.id.in_(list(ids)), c.status.in_([PENDING, FAILED]))
        .order_by(c.id)
    ).all()
    if not rows:
        return 0
    pending_tasks = set(
        conn.execute(
            select(c.task_id).where(c.task_id.in_({r.task_id for r in rows}), c.status == PENDING)
        ).scalars()
    )
    chosen: dict[str, int] = {}
    for row in rows:
        if row.status == PENDING:
            chosen[row.task_id] = row.id
        elif row.task_id not in pending_tasks:
            # At most one pending row per task id: the first failed row wins.
            chosen.setdefault(row.task_id, row.id)
    stmt = (
        update(table)
        .where(c.id.in_(list(chosen.values())))
        .ordered_values(
            (c.attempts, case((c.status == FAILED, 0), else_=c.attempts)),
            (c.status, PENDING),
            (c.available_at, now),
            (c.locked_until, None),
        )
    )
    return conn.execute(stmt).rowcount


def purge(
    conn: Connection, table: Table, *, statuses: Iterable[str], older_than: datetime, limit: int
) -> int:
    """Delete up to ``limit`` rows in ``statuses`` created before ``older_than``."""
    c = table.c
    where = and_(c.status.in_(list(statuses)), c.created_at < older_than)
    ids = conn.execute(select(c.id).where(where).order_by(c.id).limit(limit)).scalars().all()
    if not ids:
        return 0
    return conn.execute(delete(table).where(c.id.in_(ids), where)).rowcount


def count_by_status(conn: Connection, table: Table) -> dict[MessageStatus, int]:
    """Rows per status, every status listed."""
    counts = dict.fromkeys(MessageStatus, 0)
    stmt = select(table.c.status, func.count()).group_by(table.c.status)
    for status, count in conn.execute(stmt).all():
        counts[MessageStatus(status)] = count
    return counts


def record_delivery(conn: Connection, table: Table, task_id: str, *, now: datetime) -> int:
    """Count one more delivery of ``task_id`` (the first recorded one is the 2nd)."""
    c = table.c
    dialect = conn.dialect.name
    values = {"task_id": task_id, "deliveries": 2, "updated_at": now}
    bump = {"deliveries": c.deliveries + 1, "updated_at": now}
    if dialect in ("postgresql", "sqlite"):
        make = postgresql.insert if dialect == "postgresql" else sqlite.insert
        upsert = make(table).values(values)
        stmt = upsert.on_conflict_do_update(index_elements=[c.task_id], set_=bump)
        return int(conn.execute(stmt.returning(c.deliveries)).scalar_one())
    conn.execute(mysql.insert(table).values(values).on_duplicate_key_update(bump))
    return int(conn.execute(select(c.deliveries).where(c.task_id == task_id)).scalar_one())


def forget_deliveries(conn: Connection, table: Table, task_id: str) -> None:
    """Drop the delivery count of ``task_id``."""
    conn.execute(delete(table).where(table.c.task_id == task_id))


def has_skip_locked(conn: Connection) -> bool:
    """``SELECT ... FOR UPDATE SKIP LOCKED``: PostgreSQL, MySQL 8, MariaDB 10.6+."""
    dialect = conn.dialect
    if dialect.name == "postgresql":
        return True
    if dialect.name not in ("mysql", "mariadb"):
        return False  # SQLite: one writer at a time; the UPDATE ... RETURNING is atomic.
    version = dialect.server_version_info or ()
    mariadb = bool(getattr(dialect, "is_mariadb", False))
    return version >= ((10, 6) if mariadb else (8, 0, 1))
