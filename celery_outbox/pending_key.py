"""The one-pending-row-per-task-id key on MySQL/MariaDB, which have no partial indexes.

PostgreSQL and SQLite make ``task_id`` unique among pending rows with a partial unique
index (``... WHERE status = 'pending'``). MySQL and MariaDB get the same key from a
generated column, ``pending_task_id`` (the task id while the row is pending, ``NULL``
otherwise, and ``NULL``\\s never collide), with a unique index of the same name,
:data:`PENDING_TASK_INDEX`. Inserting a pending row whose task id is pending in another
transaction then waits on that key, as on PostgreSQL, and fails with a duplicate-key error
once that transaction commits: the stores take that error for "already pending". MySQL
rolls back only the failed statement, never the caller's transaction.

Both stores create it with :func:`mysql_add_pending_key` (the Django migration carries a
copy, checked equal by the tests); nothing reads or writes the column by name. A database
created before the key needs it added (Alembic: ``op.execute(mysql_add_pending_key())``).
"""

from __future__ import annotations

from celery_outbox.records import OUTBOX_TABLE, TASK_ID_MAX_LENGTH, MessageStatus

#: The unique key over pending task ids (the partial index's name on the other databases).
PENDING_TASK_INDEX = "celery_outbox_pending_task_uniq"

#: The generated column the key is over on MySQL/MariaDB.
PENDING_TASK_COLUMN = "pending_task_id"

#: MySQL/MariaDB ``ER_DUP_ENTRY``.
MYSQL_DUPLICATE_KEY = 1062


def mysql_add_pending_key(table: str = OUTBOX_TABLE) -> str:
    """The ``ALTER TABLE`` adding the generated column and its unique key to the outbox
    table ``table`` (MySQL/MariaDB)."""
    return (
        f"ALTER TABLE {table} "
        f"ADD COLUMN {PENDING_TASK_COLUMN} varchar({TASK_ID_MAX_LENGTH}) GENERATED ALWAYS AS "
        f"(CASE WHEN status = '{MessageStatus.PENDING.value}' THEN task_id END) VIRTUAL, "
        f"ADD UNIQUE INDEX {PENDING_TASK_INDEX} ({PENDING_TASK_COLUMN})"
    )


def mysql_drop_pending_key(table: str = OUTBOX_TABLE) -> str:
    """The ``ALTER TABLE`` undoing :func:`mysql_add_pending_key`."""
    return f"ALTER TABLE {table} DROP INDEX {PENDING_TASK_INDEX}, DROP COLUMN {PENDING_TASK_COLUMN}"


def is_pending_duplicate(error: BaseException) -> bool:
    """Whether ``error`` (a driver's error, or one wrapping it as its ``orig`` or cause) is
    MySQL/MariaDB's duplicate-key error on :data:`PENDING_TASK_INDEX`."""
    seen: set[int] = set()
    current: BaseException | None = error
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        args = current.args
        if (
            len(args) >= 2
            and args[0] == MYSQL_DUPLICATE_KEY
            and isinstance(args[1], str)
            and PENDING_TASK_INDEX in args[1]
        ):
            return True
        orig = getattr(current, "orig", None)
        current = orig if isinstance(orig, BaseException) else current.__cause__
    return False
