"""The PostgreSQL indexes of a workflow's steps by root id: one DDL for both stores."""

from __future__ import annotations

import importlib

import pytest

from celery_outbox.store.schema import (
    LETTER_ROOT_INDEX,
    PENDING_ROOT_INDEX,
    create_root_indexes,
    drop_root_indexes,
)


def test_the_ddl_builds_partial_expression_indexes() -> None:
    pending, letters = create_root_indexes("o", "d")
    assert pending == (
        f"CREATE INDEX {PENDING_ROOT_INDEX} ON o ((options #> '{{headers,root_id}}')) "
        "WHERE status = 'pending'"
    )
    assert letters == (
        f"CREATE INDEX {LETTER_ROOT_INDEX} ON d ((options #> '{{canvas,root_id}}')) "
        "WHERE options ? 'canvas'"
    )
    assert create_root_indexes(concurrently=True)[0].startswith("CREATE INDEX CONCURRENTLY ")
    assert drop_root_indexes() == [
        f"DROP INDEX IF EXISTS {PENDING_ROOT_INDEX}",
        f"DROP INDEX IF EXISTS {LETTER_ROOT_INDEX}",
    ]


def test_the_django_migration_carries_the_same_ddl() -> None:
    # Skipped nowhere: the migration module imports only django.db.migrations.
    migration = importlib.import_module("django_outbox.migrations.0011_workflow_root_indexes")
    assert create_root_indexes(concurrently=True) == migration.CREATE
    assert drop_root_indexes(concurrently=True) == migration.DROP


def test_the_sqlalchemy_tables_create_them_on_postgresql_only() -> None:
    pytest.importorskip("sqlalchemy")
    from sqlalchemy.dialects import postgresql
    from sqlalchemy.schema import CreateIndex

    from celery_outbox.sqlalchemy import metadata
    from celery_outbox.sqlalchemy.tables import define_tables

    tables = define_tables(type(metadata)())
    found = {
        str(index.name): str(CreateIndex(index).compile(dialect=postgresql.dialect()))
        for table in (tables.outbox, tables.dead_letter)
        for index in table.indexes
        if index.name in (PENDING_ROOT_INDEX, LETTER_ROOT_INDEX)
    }
    assert list(found.values()) == create_root_indexes()
    # SQLite has no `#>`: the tables are created there without them
    from sqlalchemy import create_engine, inspect

    engine = create_engine("sqlite://")
    tables.outbox.metadata.create_all(engine)
    names = {
        i["name"]
        for t in (tables.outbox, tables.dead_letter)
        for i in inspect(engine).get_indexes(t.name)
    }
    assert "celery_outbox_due_idx" in names
    assert not names & set(found)
