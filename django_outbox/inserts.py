"""Insert an outbox row unless its task id already has a pending one.

``task_id`` is an idempotency key. Where the database has partial unique indexes and
``INSERT ... RETURNING`` (PostgreSQL, SQLite 3.35+), one statement does it:
``INSERT ... ON CONFLICT (task_id) WHERE status = 'pending' DO NOTHING RETURNING id``.
It costs nothing extra and, unlike catching an ``IntegrityError``, never aborts the
caller's PostgreSQL transaction. Elsewhere (MySQL/MariaDB: no partial indexes) a
``SELECT`` comes first; two concurrent transactions dispatching the same explicit task
id may then both insert a row (documented).
"""

from __future__ import annotations

import functools
import json
from typing import Any

from django.db import connections, transaction
from django.db.models import Field

from celery_outbox.clock import utcnow
from celery_outbox.records import MessageStatus, NewMessage
from django_outbox.models import OutboxMessage

#: Columns the upsert writes (``id`` comes from the database).
_COLUMNS = (
    "task_id",
    "task_name",
    "payload",
    "options",
    "status",
    "available_at",
    "attempts",
    "last_error",
    "locked_until",
    "created_at",
)


def new_row(message: NewMessage) -> OutboxMessage:
    """An unsaved ``pending`` row for ``message``."""
    return OutboxMessage(**_values(message))


def _values(message: NewMessage) -> dict[str, Any]:
    return {
        "task_id": message.task_id,
        "task_name": message.task_name,
        "payload": message.payload,
        "options": dict(message.options),
        "status": MessageStatus.PENDING.value,
        "available_at": message.available_at,
        "attempts": 0,
        "last_error": "",
        "locked_until": message.locked_until,
        "created_at": utcnow(),
    }


def insert_message(message: NewMessage, *, using: str) -> int | None:
    """Insert ``message``; its row id, or ``None`` when its task id is already pending."""
    if _can_upsert(using):
        return _upsert(message, using=using)
    return _select_then_insert(new_row(message), using=using)


def _can_upsert(using: str) -> bool:
    connection = connections[using]
    return (
        connection.vendor in ("postgresql", "sqlite")
        and connection.features.can_return_columns_from_insert
    )


@functools.cache
def _fields() -> tuple[Field[Any, Any], ...]:
    by_name = {field.name: field for field in OutboxMessage._meta.concrete_fields}
    return tuple(by_name[name] for name in _COLUMNS)


#: The upsert statement per database vendor (quoting is the vendor's).
_UPSERT_SQL: dict[str, str] = {}


def _upsert_sql(connection: Any) -> str:
    sql = _UPSERT_SQL.get(connection.vendor)
    if sql is None:
        quote = connection.ops.quote_name
        # The predicate is a literal: PostgreSQL infers the partial index at parse time.
        sql = _UPSERT_SQL[connection.vendor] = (
            f"INSERT INTO {quote(OutboxMessage._meta.db_table)} "
            f"({', '.join(quote(str(field.column)) for field in _fields())}) "
            f"VALUES ({', '.join(['%s'] * len(_fields()))}) "
            f"ON CONFLICT ({quote('task_id')}) WHERE {quote('status')} = "
            f"'{MessageStatus.PENDING.value}' DO NOTHING RETURNING {quote('id')}"
        )
    return sql


def _upsert(message: NewMessage, *, using: str) -> int | None:
    # The hot path of every dispatch: no model instance and no per-field preparation
    # (both cost more than the INSERT's round trip); the values are adapted directly.
    connection = connections[using]
    when = connection.ops.adapt_datetimefield_value
    params = [
        message.task_id,
        message.task_name,
        message.payload,
        json.dumps(dict(message.options)),  # JSON text: both databases read it into the column
        MessageStatus.PENDING.value,
        when(message.available_at),
        0,
        "",
        when(message.locked_until),
        when(utcnow()),
    ]
    # Like the ORM: a failed statement marks the caller's atomic block for rollback.
    with transaction.mark_for_rollback_on_error(using=using), connection.cursor() as cursor:
        cursor.execute(_upsert_sql(connection), params)
        returned: Any = cursor.fetchone()
    return None if returned is None else int(returned[0])


def _select_then_insert(row: OutboxMessage, *, using: str) -> int | None:
    rows = OutboxMessage.objects.using(using)
    if rows.pending().filter(task_id=row.task_id).exists():
        return None
    row.save(using=using, force_insert=True)
    return int(row.pk)
