"""The outbox's tables (messages, dead letters, deliveries, completed tasks, workflows,
chord joins, the last sweep), as SQLAlchemy Core ``Table`` objects.

They mirror ``django_outbox.models`` column for column (a parity test checks), so a
Django project and a SQLAlchemy service can share one database. Hand :data:`metadata`
to Alembic's ``target_metadata``, or put the tables on your own ``MetaData`` with
:func:`define_tables`.
"""

from __future__ import annotations

from typing import NamedTuple

from sqlalchemy import DDL, Column, Index, Integer, MetaData, String, Table, Text, event, text
from sqlalchemy.dialects import mysql

from celery_outbox.sqlalchemy.types import BigIdType, JSONType, UTCDateTime
from celery_outbox.store.base import CREATE_TRIGGER
from celery_outbox.store.records import (
    CHORD_JOIN_TABLE,
    COMPLETED_TABLE,
    DEAD_LETTER_TABLE,
    DELIVERY_TABLE,
    OUTBOX_TABLE,
    SWEEP_TABLE,
    TASK_ID_MAX_LENGTH,
    TASK_NAME_MAX_LENGTH,
    WORKFLOW_TABLE,
    DeadLetterStatus,
    MessageStatus,
)
from celery_outbox.store.schema import (
    LETTER_ROOT_INDEX,
    LETTER_ROOT_KEY,
    LETTER_ROOT_WHERE,
    PENDING_ROOT_INDEX,
    PENDING_ROOT_KEY,
    PENDING_ROOT_WHERE,
    PENDING_TASK_INDEX,
    SET_FILLFACTOR,
    mysql_add_pending_key,
)

#: Dialects with partial indexes; on MySQL and MariaDB the same key is over a generated
#: column (:mod:`celery_outbox.store.schema`), added when the table is created.
PARTIAL_INDEX_DIALECTS = ("postgresql", "sqlite")

#: Dialects getting the generated column ``pending_task_id`` and its unique key.
GENERATED_KEY_DIALECTS = ("mysql", "mariadb")


class OutboxTables(NamedTuple):
    """The tables of one ``MetaData``."""

    outbox: Table
    dead_letter: Table
    delivery: Table
    completed: Table
    workflow: Table
    chord_join: Table
    sweep: Table


def define_tables(metadata: MetaData) -> OutboxTables:
    """Add the outbox, dead-letter, delivery, completed-task, workflow, chord-join and
    sweep tables to ``metadata``; return them.

    Parameters
    ----------
    metadata
        Usually your application's own ``MetaData``, so that Alembic's autogenerate
        sees the tables next to yours. Its naming convention does not apply: every
        index is named explicitly, as the Django migrations name them.
    """
    return OutboxTables(
        _outbox_table(metadata),
        _dead_letter_table(metadata),
        _delivery_table(metadata),
        _completed_table(metadata),
        _workflow_table(metadata),
        _chord_join_table(metadata),
        _sweep_table(metadata),
    )


def _outbox_table(metadata: MetaData) -> Table:
    table = Table(
        OUTBOX_TABLE,
        metadata,
        Column("id", BigIdType, primary_key=True, autoincrement=True),
        Column("task_id", String(TASK_ID_MAX_LENGTH), nullable=False),
        Column("task_name", String(TASK_NAME_MAX_LENGTH), nullable=False),
        Column("payload", Text, nullable=False),
        Column("options", JSONType, nullable=False),
        Column("status", String(16), nullable=False, default=MessageStatus.PENDING.value),
        Column("available_at", UTCDateTime, nullable=False),
        Column("attempts", Integer, nullable=False, default=0),
        Column("last_error", Text, nullable=False, default=""),
        Column("locked_until", UTCDateTime, nullable=True),
        Column("created_at", UTCDateTime, nullable=False),
        Column("published_at", UTCDateTime, nullable=True),
        Index("celery_outbox_due_idx", "status", "available_at"),
        Index("celery_outbox_task_id_idx", "task_id"),
        # A workflow's pending steps (celery_outbox.store.schema; PostgreSQL only).
        Index(
            PENDING_ROOT_INDEX, text(PENDING_ROOT_KEY), postgresql_where=text(PENDING_ROOT_WHERE)
        ).ddl_if(dialect="postgresql"),
        # Row ids are never reused on SQLite either (as Django's AUTOINCREMENT tables):
        # an id names one row for ever, so a late mark of a deleted row hits nothing.
        sqlite_autoincrement=True,
    )
    pending = table.c.status == MessageStatus.PENDING.value
    Index(
        PENDING_TASK_INDEX,
        table.c.task_id,
        unique=True,
        postgresql_where=pending,
        sqlite_where=pending,
    ).ddl_if(dialect=PARTIAL_INDEX_DIALECTS)  # type: ignore[arg-type]  # a tuple is documented
    # Not a Column of the Table: nothing reads or writes it, and the Django model has none.
    add_key = DDL(mysql_add_pending_key("%(fullname)s"))  # type: ignore[no-untyped-call]
    add_key = add_key.execute_if(dialect=GENERATED_KEY_DIALECTS)  # type: ignore[arg-type]
    event.listen(table, "after_create", add_key)
    # Room on each page for the leases' updates (celery_outbox.store.schema).
    fillfactor = DDL(SET_FILLFACTOR).execute_if(dialect="postgresql")  # type: ignore[no-untyped-call]
    event.listen(table, "after_create", fillfactor)
    for statement in CREATE_TRIGGER:  # the relay's NOTIFY (celery_outbox.store.base)
        ddl = DDL(statement).execute_if(dialect="postgresql")  # type: ignore[no-untyped-call]
        event.listen(table, "after_create", ddl)
    return table


def _dead_letter_table(metadata: MetaData) -> Table:
    return Table(
        DEAD_LETTER_TABLE,
        metadata,
        Column("id", BigIdType, primary_key=True, autoincrement=True),
        Column("task_id", String(TASK_ID_MAX_LENGTH), nullable=False),
        Column("task_name", String(TASK_NAME_MAX_LENGTH), nullable=False),
        Column("args", JSONType, nullable=False),
        Column("kwargs", JSONType, nullable=False),
        Column("options", JSONType, nullable=False),
        Column("exception_type", String(255), nullable=False),
        Column("exception_message", Text, nullable=False),
        Column("traceback", Text, nullable=False),
        Column("retries", Integer, nullable=False),
        Column("first_failed_at", UTCDateTime, nullable=False),
        Column("failed_at", UTCDateTime, nullable=False),
        Column("status", String(16), nullable=False, default=DeadLetterStatus.DEAD.value),
        Column("requeued_at", UTCDateTime, nullable=True),
        Column("requeued_by", String(150), nullable=False, default=""),
        Column("requeued_task_id", String(TASK_ID_MAX_LENGTH), nullable=False, default=""),
        Index("celery_outbox_dl_task_id_idx", "task_id"),
        Index("celery_outbox_dl_status_failed_idx", "status", "failed_at"),
        # A workflow's dead letters (celery_outbox.store.schema; PostgreSQL only).
        Index(
            LETTER_ROOT_INDEX, text(LETTER_ROOT_KEY), postgresql_where=text(LETTER_ROOT_WHERE)
        ).ddl_if(dialect="postgresql"),
    )


def _delivery_table(metadata: MetaData) -> Table:
    # One row per task message delivered more than once and not yet finished.
    return Table(
        DELIVERY_TABLE,
        metadata,
        Column("task_id", String(TASK_ID_MAX_LENGTH), primary_key=True),
        Column("deliveries", Integer, nullable=False),
        Column("updated_at", UTCDateTime, nullable=False),
    )


def _completed_table(metadata: MetaData) -> Table:
    # One row per atomic task that committed; the unique task id is what duplicates wait on.
    return Table(
        COMPLETED_TABLE,
        metadata,
        Column("id", BigIdType, primary_key=True, autoincrement=True),
        Column("task_id", String(TASK_ID_MAX_LENGTH), nullable=False, unique=True),
        Column("task_name", String(TASK_NAME_MAX_LENGTH), nullable=False),
        Column("completed_at", UTCDateTime, nullable=False),
        Column("result", Text, nullable=True),
        Column("root_id", String(TASK_ID_MAX_LENGTH), nullable=True),
        Index("celery_outbox_completed_at_idx", "completed_at"),
        Index("celery_outbox_completed_name_idx", "task_name"),
        Index("celery_outbox_completed_root_idx", "root_id"),
    )


def _workflow_table(metadata: MetaData) -> Table:
    # One row per canvas dispatched, keyed by the root id Celery gives its tasks.
    return Table(
        WORKFLOW_TABLE,
        metadata,
        Column("id", BigIdType, primary_key=True, autoincrement=True),
        Column("root_id", String(TASK_ID_MAX_LENGTH), nullable=False, unique=True),
        Column("name", String(TASK_NAME_MAX_LENGTH), nullable=False),
        Column("status", String(16), nullable=False, default="running"),
        Column("steps_total", Integer, nullable=False),
        Column("steps_done", Integer, nullable=False, default=0),
        Column("created_at", UTCDateTime, nullable=False),
        Column("finished_at", UTCDateTime, nullable=True),
        Column("failed_task_id", String(TASK_ID_MAX_LENGTH), nullable=True),
        # The workflows gauge counts each status at every scrape (celery_outbox.metrics).
        Index("outbox_workflow_status_idx", "status"),
        # The admin's workflow list is ordered by creation, newest first.
        Index("outbox_workflow_created_idx", "created_at", "id"),
    )


def _chord_join_table(metadata: MetaData) -> Table:
    # One row per chord whose header steps are counted in the database (its group id).
    return Table(
        CHORD_JOIN_TABLE,
        metadata,
        Column("id", BigIdType, primary_key=True, autoincrement=True),
        Column("group_id", String(TASK_ID_MAX_LENGTH), nullable=False, unique=True),
        Column("root_id", String(TASK_ID_MAX_LENGTH), nullable=False),
        Column("size", Integer, nullable=False),
        Column("remaining", Integer, nullable=False),
        # celery_outbox.store.records: a JSON list, one slot per header step (LONGTEXT on
        # MySQL/MariaDB, as Django's TextField: a big header's results pass 64 KiB).
        Column(
            "results", Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb"), nullable=False
        ),
        Column("created_at", UTCDateTime, nullable=False),
    )


def _sweep_table(metadata: MetaData) -> Table:
    # One row per database: when its sweep last recorded itself (celery_outbox.store.base).
    return Table(
        SWEEP_TABLE,
        metadata,
        Column("name", String(64), primary_key=True),
        Column("last_sweep_at", UTCDateTime, nullable=False),
    )


#: The library's own ``MetaData``, holding the tables.
metadata = MetaData()
#: The library's tables, on :data:`metadata` (what a store uses unless given others).
default_tables = define_tables(metadata)
(
    outbox_table,
    dead_letter_table,
    delivery_table,
    completed_table,
    workflow_table,
    chord_join_table,
    sweep_table,
) = default_tables
