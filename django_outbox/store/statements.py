"""Every raw SQL statement of the Django store (the rest goes through the ORM).

On the hot paths (every commit that dispatched a task, every sweep batch) building an
ORM query costs more than its round trip: about 550 µs against 210 µs for the same
``SELECT`` on loopback. These statements do the same work as the ORM path of
:mod:`django_outbox.store.vendors`, in one round trip each.

PostgreSQL
    :func:`claim_due` and :func:`claim_ids` lease rows in one autocommit statement,
    ``WITH claim AS (SELECT ... FOR UPDATE SKIP LOCKED) UPDATE ... RETURNING ...``,
    reading the due rows in the order of the due index ``(status, available_at)``, so a
    claim reads its batch and no more however large the backlog, and
    keeping the candidates whose predecessors hold fewer bytes than the budget (a running sum of
    ``octet_length(payload)``, which reads a stored value's size without decompressing
    it). The ``status = 'pending'`` literal lets PostgreSQL use the partial indexes.
    :func:`still_leased` takes the rows as two arrays, ``unnest``-ed into ``(id, lease)``
    pairs, so each row is checked against its own lease. The deletes of published rows
    are :mod:`django_outbox.store.transactions`'s.

PostgreSQL and SQLite 3.35+
    :func:`upsert` inserts a row unless its task id already has a pending one,
    ``INSERT ... ON CONFLICT (task_id) WHERE status = 'pending' DO NOTHING RETURNING id``:
    unlike catching an ``IntegrityError`` it never aborts the caller's PostgreSQL
    transaction.

MySQL/MariaDB
    :func:`insert_pending` inserts a row with a plain ``INSERT``; the unique key over the
    generated ``pending_task_id`` (:mod:`celery_outbox.store.schema`, migration 0008)
    decides as the partial index does elsewhere: a concurrent transaction writing the same
    pending task id makes it wait, and its duplicate-key error (which rolls back that
    statement only, never the caller's transaction) means "already pending".

PostgreSQL, SQLite and MySQL/MariaDB
    :func:`insert_completion` inserts an atomic task's ``CompletedTask`` row unless its
    task id has one: ``INSERT ... ON CONFLICT (task_id) DO NOTHING`` (PostgreSQL,
    SQLite), ``INSERT IGNORE`` (MySQL/MariaDB; the values are checked before, so it
    only ignores the duplicate key). A concurrent, uncommitted insert of the same task id
    makes it wait on the key until that transaction ends. :func:`set_result` writes the
    run's result just before the commit (both run once per atomic task).
    :func:`add_workflow_steps` creates a ``Workflow`` row or adds to its ``steps_total``
    in one statement, ``INSERT ... ON CONFLICT (root_id) DO UPDATE`` (``ON DUPLICATE KEY
    UPDATE`` on MySQL/MariaDB): a concurrent transaction adding to the same workflow waits
    on the key, then adds to the committed total, so no addition is lost.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from datetime import datetime
from typing import Any

from django.db import IntegrityError, connections, transaction

from celery_outbox.store.records import (
    COMPLETED_TABLE,
    MESSAGE_COLUMNS,
    OUTBOX_TABLE,
    WORKFLOW_TABLE,
    MessageStatus,
    NewMessage,
    StoredMessage,
)
from celery_outbox.store.schema import is_pending_duplicate
from django_outbox.models import OutboxMessage
from django_outbox.store import rows as convert
from django_outbox.store.calls import clock_of

_CLAIM = (
    "WITH claim AS ("
    f"SELECT id, available_at, octet_length(payload) AS size FROM {OUTBOX_TABLE} "
    "WHERE {where} AND status = 'pending' "
    "AND available_at <= %s AND (locked_until IS NULL OR locked_until <= %s) "
    # By the due index's own order (ties: the index's), so a claim reads its batch and
    # no more: ordering by (available_at, id) sorted every row due at the same instant (a
    # backlog written at once) on every claim.
    "ORDER BY available_at {limit} FOR UPDATE SKIP LOCKED), "
    # Each row whose predecessors hold fewer than the budget: never an empty claim.
    "budget AS (SELECT id, sum(size) OVER (ORDER BY available_at, id) - size AS before "
    "FROM claim) "
    f"UPDATE {OUTBOX_TABLE} SET locked_until = %s "
    "WHERE id IN (SELECT id FROM budget WHERE %s::bigint IS NULL OR before < %s::bigint) "
    "RETURNING {returning}"
)

#: What a claim sets or knows of every row it returns: not read back (a sweep reads 500
#: rows a claim, and each timestamp read costs as much as the rest of its row's columns).
_KNOWN = ("status", "locked_until", "published_at")
#: The columns a claim returns, in the order :func:`_stored` reads them.
_CLAIMED_COLUMNS = tuple(c for c in MESSAGE_COLUMNS if c not in _KNOWN)
_RETURNING = ", ".join(_CLAIMED_COLUMNS)
_CLAIM_IDS = _CLAIM.format(where="id = ANY(%s)", limit="", returning=_RETURNING)
_CLAIM_DUE = _CLAIM.format(
    where="(created_at <= %s OR available_at > created_at)",
    limit="LIMIT %s",
    returning=_RETURNING,
)

#: The ``(id, lease)`` pairs of two array parameters.
LEASE_PAIRS = "unnest(%s::bigint[], %s::timestamptz[]) AS lease(id, until)"

_STILL_LEASED = (
    f"SELECT m.id FROM {OUTBOX_TABLE} m JOIN {LEASE_PAIRS} "
    "ON m.id = lease.id AND m.locked_until = lease.until WHERE m.status = 'pending'"
)

#: The upsert statement per database vendor (quoting is the vendor's).
_UPSERT: dict[str, str] = {}
#: The plain insert of a pending row (MySQL/MariaDB), built once.
_INSERT: dict[str, str] = {}

_COMPLETION = (
    f"{COMPLETED_TABLE} (task_id, task_name, completed_at, result, root_id) "
    "VALUES (%s, %s, %s, NULL, %s)"
)
_DO_NOTHING = f"INSERT INTO {_COMPLETION} ON CONFLICT (task_id) DO NOTHING"
#: The insert-or-nothing of a ``CompletedTask`` row per vendor (the names need no quoting).
_INSERT_COMPLETION = {
    "postgresql": _DO_NOTHING,
    "sqlite": _DO_NOTHING,
    "mysql": f"INSERT IGNORE INTO {_COMPLETION}",
}
_SET_RESULT = f"UPDATE {COMPLETED_TABLE} SET result = %s WHERE task_id = %s"
#: Vendors :func:`insert_completion` has a statement for.
COMPLETION_VENDORS = frozenset(_INSERT_COMPLETION)

_NEW_WORKFLOW = (
    f"INSERT INTO {WORKFLOW_TABLE} (root_id, name, status, steps_total, steps_done, created_at) "
    "VALUES (%s, %s, 'running', %s, 0, %s) "
)
_ON_CONFLICT_ADD = (
    f"ON CONFLICT (root_id) DO UPDATE SET steps_total = {WORKFLOW_TABLE}.steps_total + %s"
)
#: The create-or-add of a ``Workflow`` row's steps per vendor (the names need no quoting).
_ADD_WORKFLOW_STEPS = {
    "postgresql": _NEW_WORKFLOW + _ON_CONFLICT_ADD,
    "sqlite": _NEW_WORKFLOW + _ON_CONFLICT_ADD,
    "mysql": _NEW_WORKFLOW + "ON DUPLICATE KEY UPDATE steps_total = steps_total + %s",
}
#: Vendors :func:`add_workflow_steps` has a statement for.
WORKFLOW_VENDORS = frozenset(_ADD_WORKFLOW_STEPS)


def claim_ids(
    ids: Sequence[int],
    *,
    now: datetime,
    lease_until: datetime,
    max_bytes: int | None,
    alias: str,
) -> list[StoredMessage]:
    """PostgreSQL: lease those of ``ids`` that are pending, due and unleased, within
    ``max_bytes``.
    """
    params = [list(ids), now, now, lease_until, max_bytes, max_bytes]
    return _claim(_CLAIM_IDS, params, lease_until, alias)


def claim_due(
    *,
    now: datetime,
    created_before: datetime,
    limit: int,
    lease_until: datetime,
    max_bytes: int | None,
    alias: str,
) -> list[StoredMessage]:
    """PostgreSQL: lease up to ``limit`` due rows past their grace (or parked), oldest due
    first, and no row after the one that brings the claim to ``max_bytes`` of payload.
    """
    params = [created_before, now, now, limit, lease_until, max_bytes, max_bytes]
    return _claim(_CLAIM_DUE, params, lease_until, alias)


def _claim(sql: str, params: list[Any], lease: datetime, alias: str) -> list[StoredMessage]:
    # Plain tuples, not model instances: on a sweep of 20,000 rows Django's row-to-object
    # conversion took as long as the statement itself.
    with connections[alias].cursor() as cursor:
        cursor.execute(sql, params)
        found = [_stored(row, lease) for row in cursor.fetchall()]
    return sorted(found, key=lambda row: (row.available_at, row.id))


def _stored(row: Sequence[Any], lease: datetime) -> StoredMessage:
    """The record of a pending row leased until ``lease``, returned in
    :data:`_CLAIMED_COLUMNS` order (the driver reads the JSON column as text, as it does
    for Django's ``JSONField``).
    """
    values = dict(zip(_CLAIMED_COLUMNS, row, strict=True))
    options = values["options"]
    values["options"] = json.loads(options) if isinstance(options, str) else options
    return StoredMessage(**values, status=MessageStatus.PENDING, locked_until=lease)


def still_leased(pairs: Sequence[tuple[int, datetime]], *, alias: str) -> set[int]:
    """PostgreSQL: the ids of the ``(id, lease)`` pairs whose row is pending under that lease."""
    with connections[alias].cursor() as cursor:
        cursor.execute(_STILL_LEASED, [[i for i, _ in pairs], [lease for _, lease in pairs]])
        return {row_id for (row_id,) in cursor.fetchall()}


def upsert(message: NewMessage, *, alias: str) -> int | None:
    """PostgreSQL, SQLite 3.35+: insert ``message``; its row id, or ``None`` when its task
    id is already pending.
    """
    connection = connections[alias]
    params = convert.new_message_params(message, connection, created_at=clock_of(alias)())
    # Like the ORM: a failed statement marks the caller's atomic block for rollback.
    with transaction.mark_for_rollback_on_error(using=alias), connection.cursor() as cursor:
        cursor.execute(_upsert_sql(connection), params)
        returned: Any = cursor.fetchone()
    return None if returned is None else int(returned[0])


def _insert_sql(connection: Any) -> str:
    sql = _INSERT.get(connection.vendor)
    if sql is None:
        quote = connection.ops.quote_name
        columns = convert.new_message_columns()
        sql = _INSERT[connection.vendor] = (
            f"INSERT INTO {quote(OutboxMessage._meta.db_table)} "
            f"({', '.join(quote(column) for column in columns)}) "
            f"VALUES ({', '.join(['%s'] * len(columns))})"
        )
    return sql


def _upsert_sql(connection: Any) -> str:
    sql = _UPSERT.get(connection.vendor)
    if sql is None:
        quote = connection.ops.quote_name
        # The predicate is a literal: PostgreSQL infers the partial index at parse time.
        sql = _UPSERT[connection.vendor] = (
            f"{_insert_sql(connection)} "
            f"ON CONFLICT ({quote('task_id')}) WHERE {quote('status')} = "
            f"'{MessageStatus.PENDING.value}' DO NOTHING RETURNING {quote('id')}"
        )
    return sql


def insert_pending(message: NewMessage, *, alias: str) -> int | None:
    """MySQL/MariaDB: insert ``message``; its row id, or ``None`` when its task id is
    already pending (the unique key over ``pending_task_id`` refused it).
    """
    connection = connections[alias]
    params = convert.new_message_params(message, connection, created_at=clock_of(alias)())
    # Like the ORM, any other failure marks the caller's atomic block for rollback.
    with transaction.mark_for_rollback_on_error(using=alias), connection.cursor() as cursor:
        try:
            cursor.execute(_insert_sql(connection), params)
        except IntegrityError as error:
            if not is_pending_duplicate(error):
                raise
            return None  # only this statement was rolled back: the transaction goes on
        return int(cursor.lastrowid)


def insert_completion(
    task_id: str, task_name: str, *, now: datetime, root_id: str | None, alias: str
) -> bool:
    """Insert ``task_id``'s ``CompletedTask`` row (``result`` NULL) unless it has one;
    whether it did. Waits while another transaction holds the same task id.
    """
    connection = connections[alias]
    params = [task_id, task_name, connection.ops.adapt_datetimefield_value(now), root_id]
    with transaction.mark_for_rollback_on_error(using=alias), connection.cursor() as cursor:
        cursor.execute(_INSERT_COMPLETION[connection.vendor], params)
        return bool(cursor.rowcount == 1)


def set_result(task_id: str, result: str, *, alias: str) -> None:
    """Write ``result`` into ``task_id``'s ``CompletedTask`` row (one ``UPDATE``)."""
    with transaction.mark_for_rollback_on_error(using=alias), connections[alias].cursor() as cursor:
        cursor.execute(_SET_RESULT, [result, task_id])


def add_workflow_steps(root_id: str, *, name: str, steps: int, now: datetime, alias: str) -> None:
    """Create ``root_id``'s ``running`` workflow with ``steps`` steps, or add ``steps`` to
    the ``steps_total`` of its row (one statement; PostgreSQL, SQLite, MySQL/MariaDB).
    """
    connection = connections[alias]
    params = [root_id, name, steps, connection.ops.adapt_datetimefield_value(now), steps]
    with transaction.mark_for_rollback_on_error(using=alias), connection.cursor() as cursor:
        cursor.execute(_ADD_WORKFLOW_STEPS[connection.vendor], params)
