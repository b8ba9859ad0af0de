"""celery-outbox: the outbox's tables, their indexes and their database extras.

The first revision on the branch ``celery_outbox`` (``alembic upgrade celery_outbox@head``;
``alembic downgrade celery_outbox@base`` removes it all). It builds what
``celery_outbox.sqlalchemy.metadata.create_all()`` builds, and what the Django migrations of
``django_outbox`` build, so a Django project and a SQLAlchemy service can share one database:

- the seven tables (messages, dead letters, deliveries, completed tasks, workflows, chord
  joins, the last sweep) and their indexes;
- PostgreSQL: the partial unique index over pending task ids, the two root-id expression
  indexes, a fill factor of 50 on the outbox table and the ``NOTIFY`` trigger of the relay;
- SQLite: the partial unique index over pending task ids;
- MySQL/MariaDB: the generated column ``pending_task_id`` and its unique key.

The statements are copies, frozen here as a migration must be: a later change to the tables
ships as a new revision on this branch (tests/contract/test_alembic_revisions.py checks that
this copy still builds what ``create_all`` builds).

Revision ID: celery_outbox_0001
Revises:
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import mysql, postgresql

from celery_outbox.sqlalchemy.types import UTCDateTime

revision = "celery_outbox_0001"
down_revision = None
branch_labels = ("celery_outbox",)
depends_on = None

#: Primary keys: ``bigint``, ``INTEGER`` on SQLite (where only that autoincrements).
_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")

#: JSON documents: ``jsonb`` on PostgreSQL.
_JSON = sa.JSON().with_variant(postgresql.JSONB(), "postgresql")

#: Task ids and task names (``celery_outbox.store.records``).
_TASK_ID = 255
_TASK_NAME = 255

_PENDING = "status = 'pending'"

_POSTGRESQL_EXTRAS = (
    "CREATE INDEX celery_outbox_pending_root_idx ON celery_outbox_message "
    "((options #> '{headers,root_id}')) WHERE status = 'pending'",
    "CREATE INDEX celery_outbox_dl_root_idx ON celery_outbox_deadletter "
    "((options #> '{canvas,root_id}')) WHERE options ? 'canvas'",
    "ALTER TABLE celery_outbox_message SET (fillfactor = 50)",
    "CREATE OR REPLACE FUNCTION celery_outbox_notify() RETURNS trigger LANGUAGE plpgsql AS "
    "$$ BEGIN PERFORM pg_notify('celery_outbox', ''); RETURN NULL; END $$",
    "DROP TRIGGER IF EXISTS celery_outbox_notify_insert ON celery_outbox_message",
    "CREATE TRIGGER celery_outbox_notify_insert AFTER INSERT ON celery_outbox_message FOR EACH ROW "
    "WHEN (NEW.locked_until IS NULL) EXECUTE PROCEDURE celery_outbox_notify()",
)

_MYSQL_PENDING_KEY = (
    "ALTER TABLE celery_outbox_message "
    "ADD COLUMN pending_task_id varchar(255) GENERATED ALWAYS AS "
    "(CASE WHEN status = 'pending' THEN task_id END) VIRTUAL, "
    "ADD UNIQUE INDEX celery_outbox_pending_task_uniq (pending_task_id)"
)

_POSTGRESQL_DROPS = (
    "DROP TRIGGER IF EXISTS celery_outbox_notify_insert ON celery_outbox_message",
    "DROP FUNCTION IF EXISTS celery_outbox_notify()",
)


def upgrade() -> None:
    """Create the tables, their indexes and the extras of the database's dialect."""
    dialect = op.get_bind().dialect.name
    _create_outbox(dialect)
    _create_dead_letters()
    _create_small_tables()
    if dialect == "postgresql":
        for statement in _POSTGRESQL_EXTRAS:
            op.execute(statement)
    elif dialect in ("mysql", "mariadb"):
        op.execute(_MYSQL_PENDING_KEY)


def downgrade() -> None:
    """Drop everything :func:`upgrade` created (the trigger and its function too)."""
    if op.get_bind().dialect.name == "postgresql":
        for statement in _POSTGRESQL_DROPS:
            op.execute(statement)
    for table in (
        "celery_outbox_sweep",
        "outbox_chord_join",
        "outbox_workflow",
        "celery_outbox_completedtask",
        "celery_outbox_delivery",
        "celery_outbox_deadletter",
        "celery_outbox_message",
    ):
        op.drop_table(table)


def _create_outbox(dialect: str) -> None:
    op.create_table(
        "celery_outbox_message",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("task_id", sa.String(_TASK_ID), nullable=False),
        sa.Column("task_name", sa.String(_TASK_NAME), nullable=False),
        sa.Column("payload", sa.Text(), nullable=False),
        sa.Column("options", _JSON, nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("available_at", UTCDateTime(), nullable=False),
        sa.Column("attempts", sa.Integer(), nullable=False),
        sa.Column("last_error", sa.Text(), nullable=False),
        sa.Column("locked_until", UTCDateTime(), nullable=True),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("published_at", UTCDateTime(), nullable=True),
        sqlite_autoincrement=True,
    )
    op.create_index("celery_outbox_due_idx", "celery_outbox_message", ["status", "available_at"])
    op.create_index("celery_outbox_task_id_idx", "celery_outbox_message", ["task_id"])
    if dialect in ("postgresql", "sqlite"):
        op.create_index(
            "celery_outbox_pending_task_uniq",
            "celery_outbox_message",
            ["task_id"],
            unique=True,
            postgresql_where=sa.text(_PENDING),
            sqlite_where=sa.text(_PENDING),
        )


def _create_dead_letters() -> None:
    op.create_table(
        "celery_outbox_deadletter",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("task_id", sa.String(_TASK_ID), nullable=False),
        sa.Column("task_name", sa.String(_TASK_NAME), nullable=False),
        sa.Column("args", _JSON, nullable=False),
        sa.Column("kwargs", _JSON, nullable=False),
        sa.Column("options", _JSON, nullable=False),
        sa.Column("exception_type", sa.String(255), nullable=False),
        sa.Column("exception_message", sa.Text(), nullable=False),
        sa.Column("traceback", sa.Text(), nullable=False),
        sa.Column("retries", sa.Integer(), nullable=False),
        sa.Column("first_failed_at", UTCDateTime(), nullable=False),
        sa.Column("failed_at", UTCDateTime(), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("requeued_at", UTCDateTime(), nullable=True),
        sa.Column("requeued_by", sa.String(150), nullable=False),
        sa.Column("requeued_task_id", sa.String(_TASK_ID), nullable=False),
    )
    op.create_index("celery_outbox_dl_task_id_idx", "celery_outbox_deadletter", ["task_id"])
    op.create_index(
        "celery_outbox_dl_status_failed_idx", "celery_outbox_deadletter", ["status", "failed_at"]
    )


def _create_small_tables() -> None:
    op.create_table(
        "celery_outbox_delivery",
        sa.Column("task_id", sa.String(_TASK_ID), primary_key=True),
        sa.Column("deliveries", sa.Integer(), nullable=False),
        sa.Column("updated_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "celery_outbox_completedtask",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("task_id", sa.String(_TASK_ID), nullable=False, unique=True),
        sa.Column("task_name", sa.String(_TASK_NAME), nullable=False),
        sa.Column("completed_at", UTCDateTime(), nullable=False),
        sa.Column("result", sa.Text(), nullable=True),
        sa.Column("root_id", sa.String(_TASK_ID), nullable=True),
    )
    for name, column in (
        ("celery_outbox_completed_at_idx", "completed_at"),
        ("celery_outbox_completed_name_idx", "task_name"),
        ("celery_outbox_completed_root_idx", "root_id"),
    ):
        op.create_index(name, "celery_outbox_completedtask", [column])
    op.create_table(
        "outbox_workflow",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("root_id", sa.String(_TASK_ID), nullable=False, unique=True),
        sa.Column("name", sa.String(_TASK_NAME), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("steps_total", sa.Integer(), nullable=False),
        sa.Column("steps_done", sa.Integer(), nullable=False),
        sa.Column("created_at", UTCDateTime(), nullable=False),
        sa.Column("finished_at", UTCDateTime(), nullable=True),
        sa.Column("failed_task_id", sa.String(_TASK_ID), nullable=True),
    )
    op.create_index("outbox_workflow_status_idx", "outbox_workflow", ["status"])
    op.create_index("outbox_workflow_created_idx", "outbox_workflow", ["created_at", "id"])
    op.create_table(
        "outbox_chord_join",
        sa.Column("id", _ID, primary_key=True, autoincrement=True),
        sa.Column("group_id", sa.String(_TASK_ID), nullable=False, unique=True),
        sa.Column("root_id", sa.String(_TASK_ID), nullable=False),
        sa.Column("size", sa.Integer(), nullable=False),
        sa.Column("remaining", sa.Integer(), nullable=False),
        sa.Column(
            "results", sa.Text().with_variant(mysql.LONGTEXT(), "mysql", "mariadb"), nullable=False
        ),
        sa.Column("created_at", UTCDateTime(), nullable=False),
    )
    op.create_table(
        "celery_outbox_sweep",
        sa.Column("name", sa.String(64), primary_key=True),
        sa.Column("last_sweep_at", UTCDateTime(), nullable=False),
    )
