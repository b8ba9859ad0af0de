"""Every statement of the SQLAlchemy store, built with SQLAlchemy Core.

The SQL of the store, built with SQLAlchemy Core and portable across dialects.

Each function takes a ``Connection`` (in whatever transaction the store chose) and
runs a bounded number of statements. Dialect differences are kept here (and, for the
insert of a pending row, in :mod:`~celery_outbox.sqlalchemy.statements`): ``UPDATE ...
RETURNING`` versus ``SELECT ... FOR UPDATE`` then ``UPDATE``, and assignment order
(MySQL evaluates ``SET`` left to right with the new values, so every expression
reading a column comes before that column's own assignment).

The claim statement: lease due rows, locked where the database can, cut at a byte budget.

With ``UPDATE ... RETURNING`` (PostgreSQL, SQLite) one statement picks the candidates
(``FOR UPDATE SKIP LOCKED`` on PostgreSQL), keeps those within the budget with a running
sum of their payload sizes, leases them and returns them. Without it (MySQL, MariaDB) the
candidates' ids and sizes are read and locked first, so no payload beyond the budget is
ever sent to the client.

Inserting an outbox row: the one-pending-row-per-task-id key, and superseding.

``INSERT ... ON CONFLICT (task_id) WHERE status = 'pending' DO NOTHING`` on PostgreSQL
and SQLite, where the partial unique index decides atomically without aborting the
caller's transaction. On MySQL/MariaDB a plain ``INSERT``: the unique key over the
generated ``pending_task_id`` (:mod:`celery_outbox.store.schema`) decides as atomically
(after a ``SELECT`` that keeps tables created before the key idempotent but racy), and its
duplicate-key error, which rolls back that statement only, means "already pending".
A pending row that the core's rule supersedes (:mod:`celery_outbox.store.superseding`) is
locked, deleted while still pending and replaced, in the same transaction.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime
from typing import Any

from sqlalchemy import (
    CTE,
    ColumnElement,
    Connection,
    CursorResult,
    Executable,
    Select,
    Table,
    and_,
    bindparam,
    case,
    delete,
    func,
    insert,
    literal,
    literal_column,
    or_,
    select,
    update,
)
from sqlalchemy.dialects import mysql, postgresql, sqlite
from sqlalchemy.exc import IntegrityError

from celery_outbox.store.base import within_budget
from celery_outbox.store.records import MessageStatus, StoredMessage, stored_message
from celery_outbox.store.schema import is_pending_duplicate

# --- The SQL of the store, built with SQLAlchemy Core and portable across dialects.

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
    on-commit publisher may still hold.
    """
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
    rows again).
    """
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
    wait for the WAL flush (:func:`committing_asynchronously`).
    """
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
    how many changed.
    """
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


# --- The claim statement: lease due rows, locked where the database can, cut at a byte budget.


def lease(
    conn: Connection,
    table: Table,
    candidates: Select[Any],
    *,
    lease_until: datetime,
    max_bytes: int | None = None,
) -> list[StoredMessage]:
    """Lease the rows ``candidates`` selects (locked, skipping locked rows, where the
    database can), ordered by ``(available_at, id)`` and cut at ``max_bytes`` of payload;
    return them.
    """
    c = table.c
    if has_skip_locked(conn):
        candidates = candidates.with_for_update(skip_locked=True)
    size = (func.length if conn.dialect.name == "sqlite" else func.octet_length)(c.payload)
    sized = candidates.with_only_columns(c.id, c.available_at, size.label("size"))
    if conn.dialect.update_returning:
        stmt = (
            update(table)
            .where(c.id.in_(_within_budget(sized.cte("celery_outbox_claim"), max_bytes)))
            .values(locked_until=lease_until)
            .returning(*c)
        )
        messages = [stored_message(row) for row in conn.execute(stmt).mappings().all()]
    else:
        found = conn.execute(sized).all()  # locks the candidates; payloads stay behind
        ids = [row.id for row in found[: within_budget((row.size for row in found), max_bytes)]]
        if ids:
            conn.execute(update(table).where(c.id.in_(ids)).values(locked_until=lease_until))
        rows = conn.execute(select(table).where(c.id.in_(ids))).mappings().all() if ids else []
        messages = [stored_message(row) for row in rows]
    return sorted(messages, key=lambda m: (m.available_at, m.id))


def _within_budget(sized: CTE, max_bytes: int | None) -> Select[Any]:
    """The ids of ``sized`` (id, available_at, size) a claim of ``max_bytes`` takes: each
    row whose predecessors hold fewer bytes (as :func:`within_budget` counts).
    """
    if max_bytes is None:
        return select(sized.c.id)
    order = (sized.c.available_at, sized.c.id)
    before = func.sum(sized.c.size).over(order_by=order) - sized.c.size
    running = select(sized.c.id, before.label("before")).cte("celery_outbox_budget")
    return select(running.c.id).where(running.c.before < max_bytes)


# --- Inserting an outbox row: the one-pending-row-per-task-id key, and superseding.


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
    pending row was deleted to make room.
    """
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
    id``, built once per table and dialect; the row's values are its parameters.
    """
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
    ``None`` (nothing written) when a pending row stays.
    """
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
    the id of each row written, by task id (a task id has at most one pending row).
    """
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
