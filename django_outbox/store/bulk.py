"""Batched dispatch in the Django store: the rows of one batch in one ``INSERT``.

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
"""

from __future__ import annotations

import sqlite3
from collections.abc import Hashable, Sequence
from typing import Any

from django.db import connections, transaction

from celery_outbox.records import MessageStatus, NewMessage
from django_outbox.models import OutboxMessage
from django_outbox.store import rows as convert
from django_outbox.store.clocks import clock_of

#: The multi-row upsert per (vendor, rows), built once.
_STATEMENTS: dict[tuple[str, int], str] = {}


def token(alias: str) -> Hashable | None:
    """The transaction a write to ``alias`` joins now: the connection and its savepoints;
    ``None`` outside an atomic block (the row commits at once)."""
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
    its task id was already pending."""
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
