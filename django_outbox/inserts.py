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

from typing import Any

from django.db import connections, transaction

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
    "created_at",
)


def new_row(message: NewMessage) -> OutboxMessage:
    """An unsaved ``pending`` row for ``message``."""
    return OutboxMessage(
        task_id=message.task_id,
        task_name=message.task_name,
        payload=message.payload,
        options=dict(message.options),
        status=MessageStatus.PENDING.value,
        available_at=message.available_at,
        created_at=utcnow(),
    )


def insert_message(message: NewMessage, *, using: str) -> int | None:
    """Insert ``message``; its row id, or ``None`` when its task id is already pending."""
    if _can_upsert(using):
        return _upsert(new_row(message), using=using)
    return _select_then_insert(new_row(message), using=using)


def _can_upsert(using: str) -> bool:
    connection = connections[using]
    return (
        connection.vendor in ("postgresql", "sqlite")
        and connection.features.can_return_columns_from_insert
    )


def _upsert(row: OutboxMessage, *, using: str) -> int | None:
    connection = connections[using]
    quote = connection.ops.quote_name
    by_name = {field.name: field for field in OutboxMessage._meta.concrete_fields}
    fields = [by_name[name] for name in _COLUMNS]
    params = [field.get_db_prep_save(getattr(row, field.attname), connection) for field in fields]
    # The predicate is a literal: PostgreSQL infers the partial index from it at parse time.
    sql = (
        f"INSERT INTO {quote(OutboxMessage._meta.db_table)} "
        f"({', '.join(quote(str(field.column)) for field in fields)}) "
        f"VALUES ({', '.join(['%s'] * len(fields))}) "
        f"ON CONFLICT ({quote('task_id')}) WHERE {quote('status')} = "
        f"'{MessageStatus.PENDING.value}' DO NOTHING RETURNING {quote('id')}"
    )
    # Like the ORM: a failed statement marks the caller's atomic block for rollback.
    with transaction.mark_for_rollback_on_error(using=using), connection.cursor() as cursor:
        cursor.execute(sql, params)
        returned: Any = cursor.fetchone()
    return None if returned is None else int(returned[0])


def _select_then_insert(row: OutboxMessage, *, using: str) -> int | None:
    rows = OutboxMessage.objects.using(using)
    if rows.pending().filter(task_id=row.task_id).exists():
        return None
    row.save(using=using, force_insert=True)
    return int(row.pk)
