r"""The schema's extras beyond tables: the MySQL pending key, the root indexes, the outbox
table's fill factor.

The one-pending-row-per-task-id key on MySQL/MariaDB, which have no partial indexes.

PostgreSQL and SQLite make ``task_id`` unique among pending rows with a partial unique
index (``... WHERE status = 'pending'``). MySQL and MariaDB get the same key from a
generated column, ``pending_task_id`` (the task id while the row is pending, ``NULL``
otherwise, and ``NULL``\s never collide), with a unique index of the same name,
:data:`PENDING_TASK_INDEX`. Inserting a pending row whose task id is pending in another
transaction then waits on that key, as on PostgreSQL, and fails with a duplicate-key error
once that transaction commits: the stores take that error for "already pending". MySQL
rolls back only the failed statement, never the caller's transaction.

Both stores create it with :func:`mysql_add_pending_key` (the Django migration carries a
copy, checked equal by the tests); nothing reads or writes the column by name. A database
created before the key needs it added (Alembic: ``op.execute(mysql_add_pending_key())``).

The indexes that find a workflow's steps by its root id, on PostgreSQL (issue 19).

A workflow's pending steps are the pending outbox rows whose Celery headers hold its root
id, ``options #> '{headers,root_id}'``; its failed steps are the dead letters whose
canvas does, ``options #> '{canvas,root_id}'``. Without an index, each lookup reads
every pending row or every dead letter (0.3 s over 140,000 parked rows). Both indexes
are partial (pending rows only; letters with a canvas only), so published rows and
plain letters cost nothing to index.

PostgreSQL only: the queries that use them (``django_outbox.admin.workflows``) must
spell the same expression and imply the condition. The key is ``jsonb`` (``#>``), as
Django's ``options__headers__root_id=...`` compares it on PostgreSQL; that lookup means
the same on every database (``KT()`` compared to a string does not on SQLite and
MariaDB, Django 5.2). SQLite could build such indexes but never uses them for Django's
query (the path is a bound parameter there), and MySQL/MariaDB have no partial indexes
(MariaDB no expression indexes either); on those the lookups scan, as before.

Both stores create them from these statements (the Django migration carries a copy,
checked equal by the tests). A database created before them needs them added (Alembic:
``op.execute(stmt)`` for each of :func:`create_root_indexes`).

How PostgreSQL stores the outbox table: half of each page kept free for leases.

Every claim leases its rows with an ``UPDATE`` of ``locked_until``, a column no index
holds. PostgreSQL writes such an update as a heap-only tuple (HOT) on the row's own page
when that page has room: no new entry in any of the table's five indexes. On a table
packed full (the default fill factor, 100) every lease went to another page and wrote
five index entries: half of a 500-row claim's time in the database, and a due index that
grew with each claim until a vacuum. A fill factor of 50 leaves room for each row's
lease on its page (an outbox row is written once, leased, then deleted: the table is
small in steady state, so the space costs little). It applies to pages written after it
is set; an existing table is not rewritten. Other databases keep their defaults.

Both stores set it: Django's migration ``0012_outbox_fillfactor`` and the SQLAlchemy
table's ``CREATE`` (:mod:`celery_outbox.sqlalchemy.tables`).
"""

from __future__ import annotations

from celery_outbox.store.records import (
    DEAD_LETTER_TABLE,
    OUTBOX_TABLE,
    TASK_ID_MAX_LENGTH,
    MessageStatus,
)

# --- The one-pending-row-per-task-id key on MySQL/MariaDB, which have no partial indexes.

#: The unique key over pending task ids (the partial index's name on the other databases).
PENDING_TASK_INDEX = "celery_outbox_pending_task_uniq"

#: The generated column the key is over on MySQL/MariaDB.
PENDING_TASK_COLUMN = "pending_task_id"

#: MySQL/MariaDB ``ER_DUP_ENTRY``.
MYSQL_DUPLICATE_KEY = 1062


def mysql_add_pending_key(table: str = OUTBOX_TABLE) -> str:
    """The ``ALTER TABLE`` adding the generated column and its unique key to the outbox
    table ``table`` (MySQL/MariaDB).
    """
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
    MySQL/MariaDB's duplicate-key error on :data:`PENDING_TASK_INDEX`.
    """
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


# --- The indexes that find a workflow's steps by its root id, on PostgreSQL (issue 19).

#: Pending outbox rows by ``options #> '{headers,root_id}'``.
PENDING_ROOT_INDEX = "celery_outbox_pending_root_idx"

#: Dead letters with a canvas by ``options #> '{canvas,root_id}'``.
LETTER_ROOT_INDEX = "celery_outbox_dl_root_idx"

#: The indexed expression of each index, and the predicate of its rows.
PENDING_ROOT_KEY = "(options #> '{headers,root_id}')"

PENDING_ROOT_WHERE = f"status = '{MessageStatus.PENDING.value}'"

LETTER_ROOT_KEY = "(options #> '{canvas,root_id}')"

LETTER_ROOT_WHERE = "options ? 'canvas'"


def create_root_indexes(
    outbox: str = OUTBOX_TABLE, letters: str = DEAD_LETTER_TABLE, *, concurrently: bool = False
) -> list[str]:
    """The ``CREATE INDEX`` statements of both indexes (PostgreSQL), on the tables
    ``outbox`` and ``letters``; ``concurrently`` builds them without blocking writes
    (outside a transaction).
    """
    how = "CONCURRENTLY " if concurrently else ""
    return [
        f"CREATE INDEX {how}{PENDING_ROOT_INDEX} ON {outbox} ({PENDING_ROOT_KEY}) "
        f"WHERE {PENDING_ROOT_WHERE}",
        f"CREATE INDEX {how}{LETTER_ROOT_INDEX} ON {letters} ({LETTER_ROOT_KEY}) "
        f"WHERE {LETTER_ROOT_WHERE}",
    ]


def drop_root_indexes(*, concurrently: bool = False) -> list[str]:
    """The ``DROP INDEX IF EXISTS`` statements undoing :func:`create_root_indexes` (also
    of an invalid index a failed concurrent build left).
    """
    how = "CONCURRENTLY " if concurrently else ""
    return [f"DROP INDEX {how}IF EXISTS {name}" for name in (PENDING_ROOT_INDEX, LETTER_ROOT_INDEX)]


# --- How PostgreSQL stores the outbox table: half of each page kept free for leases.

#: Percent of each page of the outbox table filled by inserts (PostgreSQL).
FILLFACTOR = 50

#: Sets it (pages written from then on).
SET_FILLFACTOR = f"ALTER TABLE {OUTBOX_TABLE} SET (fillfactor = {FILLFACTOR})"

#: Back to PostgreSQL's default.
RESET_FILLFACTOR = f"ALTER TABLE {OUTBOX_TABLE} RESET (fillfactor)"
