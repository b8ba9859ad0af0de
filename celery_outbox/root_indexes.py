"""The indexes that find a workflow's steps by its root id, on PostgreSQL (issue 19).

A workflow's pending steps are the pending outbox rows whose Celery headers hold its root
id, ``options #> '{headers,root_id}'``; its failed steps are the dead letters whose
canvas does, ``options #> '{canvas,root_id}'``. Without an index, each lookup reads
every pending row or every dead letter (0.3 s over 140,000 parked rows). Both indexes
are partial (pending rows only; letters with a canvas only), so published rows and
plain letters cost nothing to index.

PostgreSQL only: the queries that use them (``django_outbox.admin_workflows``) must
spell the same expression and imply the condition. The key is ``jsonb`` (``#>``), as
Django's ``options__headers__root_id=...`` compares it on PostgreSQL; that lookup means
the same on every database (``KT()`` compared to a string does not on SQLite and
MariaDB, Django 5.2). SQLite could build such indexes but never uses them for Django's
query (the path is a bound parameter there), and MySQL/MariaDB have no partial indexes
(MariaDB no expression indexes either); on those the lookups scan, as before.

Both stores create them from these statements (the Django migration carries a copy,
checked equal by the tests). A database created before them needs them added (Alembic:
``op.execute(stmt)`` for each of :func:`create_root_indexes`).
"""

from __future__ import annotations

from celery_outbox.records import DEAD_LETTER_TABLE, OUTBOX_TABLE, MessageStatus

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
    (outside a transaction)."""
    how = "CONCURRENTLY " if concurrently else ""
    return [
        f"CREATE INDEX {how}{PENDING_ROOT_INDEX} ON {outbox} ({PENDING_ROOT_KEY}) "
        f"WHERE {PENDING_ROOT_WHERE}",
        f"CREATE INDEX {how}{LETTER_ROOT_INDEX} ON {letters} ({LETTER_ROOT_KEY}) "
        f"WHERE {LETTER_ROOT_WHERE}",
    ]


def drop_root_indexes(*, concurrently: bool = False) -> list[str]:
    """The ``DROP INDEX IF EXISTS`` statements undoing :func:`create_root_indexes` (also
    of an invalid index a failed concurrent build left)."""
    how = "CONCURRENTLY " if concurrently else ""
    return [f"DROP INDEX {how}IF EXISTS {name}" for name in (PENDING_ROOT_INDEX, LETTER_ROOT_INDEX)]
