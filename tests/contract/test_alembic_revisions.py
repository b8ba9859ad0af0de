"""The shipped Alembic revisions build what ``metadata.create_all`` builds, on PostgreSQL,
MariaDB and SQLite, and what the Django migrations build (one database can be shared).

Each test upgrades a fresh database with ``alembic upgrade celery_outbox@head`` through a
throwaway Alembic environment that only names :data:`ALEMBIC_VERSIONS`, as an application's
``env.py`` would, then compares what the database holds.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("alembic")

from alembic import command
from alembic.autogenerate import compare_metadata
from alembic.config import Config
from alembic.runtime.migration import MigrationContext
from sqlalchemy import create_engine, inspect, text
from sqlalchemy.engine import Engine, make_url

from celery_outbox.sqlalchemy import ALEMBIC_VERSIONS, metadata
from celery_outbox.store import schema
from celery_outbox.store.base import CREATE_TRIGGER, DROP_TRIGGER, NOTIFY_FUNCTION, NOTIFY_TRIGGER
from celery_outbox.store.records import OUTBOX_TABLE
from tests import services

ENV_PY = """
from alembic import context
from sqlalchemy import create_engine

connectable = create_engine(context.config.get_main_option("sqlalchemy.url"))
with connectable.connect() as connection:
    context.configure(connection=connection, target_metadata=None)
    with context.begin_transaction():
        context.run_migrations()
connectable.dispose()
"""

#: The library's tables (an application's own are not ours to compare).
TABLES = sorted(metadata.tables)


def alembic_config(tmp_path: Path, url: str) -> Config:
    """An application's Alembic setup: its own script folder, plus the outbox's revisions."""
    scripts = tmp_path / "migrations"
    (scripts / "versions").mkdir(parents=True, exist_ok=True)
    (scripts / "env.py").write_text(ENV_PY)
    (scripts / "script.py.mako").write_text("")
    config = Config()
    config.set_main_option("script_location", str(scripts))
    config.set_main_option("path_separator", "os")
    config.set_main_option(
        "version_locations", os.pathsep.join([str(scripts / "versions"), ALEMBIC_VERSIONS])
    )
    config.set_main_option("sqlalchemy.url", url.replace("%", "%%"))
    return config


def snapshot(engine: Engine) -> dict[str, Any]:
    """What the database holds of the library's tables: columns, keys, indexes, extras."""
    inspector = inspect(engine)
    found: dict[str, Any] = {}
    for table in TABLES:
        found[table] = {
            "columns": [
                (c["name"], str(c["type"]), bool(c["nullable"]))
                for c in inspector.get_columns(table)
            ],
            "primary key": inspector.get_pk_constraint(table)["constrained_columns"],
            "unique": sorted(
                tuple(u["column_names"]) for u in inspector.get_unique_constraints(table)
            ),
            "indexes": sorted(
                (
                    str(i["name"]),
                    tuple(str(c) for c in i["column_names"] if c is not None),
                    tuple(i.get("expressions") or ()),
                    bool(i["unique"]),
                    str(i.get("dialect_options", {}).get("postgresql_where") or ""),
                )
                for i in inspector.get_indexes(table)
                if not str(i["name"]).endswith("_like")  # Django's varchar_pattern_ops copies
            ),
        }
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            found["fillfactor"] = connection.scalar(
                text("SELECT reloptions FROM pg_class WHERE relname = :t"), {"t": OUTBOX_TABLE}
            )
            found["triggers"] = connection.execute(
                text(
                    "SELECT tgname, pg_get_triggerdef(oid) FROM pg_trigger "
                    "WHERE tgrelid = CAST(:t AS regclass) AND NOT tgisinternal"
                ),
                {"t": OUTBOX_TABLE},
            ).all()
    return found


def leftovers(engine: Engine) -> dict[str, Any]:
    """The library's tables (and PostgreSQL function) still in the database."""
    left: dict[str, Any] = {"tables": sorted(set(inspect(engine).get_table_names()) & set(TABLES))}
    if engine.dialect.name == "postgresql":
        with engine.connect() as connection:
            left["function"] = connection.scalar(
                text("SELECT count(*) FROM pg_proc WHERE proname = :f"), {"f": NOTIFY_FUNCTION}
            )
    return left


def _compared(dialect: str) -> Any:
    """Alembic's ``include_object`` for ``dialect``: the indexes the ``Table`` builds on
    other dialects only (``ddl_if``), and the MySQL pending key, which DDL outside the
    ``Table`` builds (``celery_outbox.store.schema``), are not compared.
    """

    def include(obj: Any, name: str | None, kind: str, reflected: bool, other: Any) -> bool:
        condition = getattr(obj, "_ddl_if", None)
        if kind == "index" and condition is not None and condition.dialect is not None:
            dialects = condition.dialect
            wanted = (dialects,) if isinstance(dialects, str) else tuple(dialects)
            if dialect not in wanted:
                return False
        extras = (schema.PENDING_TASK_COLUMN, schema.PENDING_TASK_INDEX)
        return not (reflected and dialect == "mysql" and name in extras)

    return include


@pytest.fixture(params=["sqlite", "postgresql", "mysql"])
def two_databases(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[tuple[str, str]]:
    """Two fresh, empty databases of one kind: one for Alembic, one for ``create_all``."""
    if request.param == "sqlite":
        yield f"sqlite:///{tmp_path / 'alembic.sqlite3'}", f"sqlite:///{tmp_path / 'all.sqlite3'}"
        return
    if request.param == "postgresql":
        server = request.getfixturevalue("postgres_url")
        driver = "postgresql+psycopg"
        create = services.create_postgres_database
        drop = services.drop_postgres_database
    else:
        server = request.getfixturevalue("mysql_url")
        driver = "mysql+pymysql"
        create = services.create_mysql_database
        drop = services.drop_mysql_database
    names = [services.unique_name("outbox_alembic_") for _ in range(2)]
    for name in names:
        create(server, name)
    try:
        yield tuple(  # type: ignore[misc]
            make_url(services.with_db_name(server, name))
            .set(drivername=driver)
            .render_as_string(hide_password=False)
            for name in names
        )
    finally:
        for name in names:
            drop(server, name)


def test_the_upgraded_schema_is_what_create_all_builds(
    two_databases: tuple[str, str], tmp_path: Path
) -> None:
    upgraded_url, created_url = two_databases
    command.upgrade(alembic_config(tmp_path, upgraded_url), "celery_outbox@head")
    upgraded = create_engine(upgraded_url)
    created = create_engine(created_url)
    try:
        metadata.create_all(created)
        with upgraded.connect() as connection:
            context = MigrationContext.configure(
                connection,
                opts={"include_object": _compared(upgraded.dialect.name), "compare_type": True},
            )
            with warnings.catch_warnings():
                # SQLite cannot reflect expression indexes: those are PostgreSQL's only.
                warnings.filterwarnings("ignore", "autogenerate skipping metadata-specified")
                differences = compare_metadata(context, metadata)
            assert differences == []
        assert snapshot(upgraded) == snapshot(created)
    finally:
        upgraded.dispose()
        created.dispose()


def test_the_dialect_extras_are_built(two_databases: tuple[str, str], tmp_path: Path) -> None:
    url = two_databases[0]
    command.upgrade(alembic_config(tmp_path, url), "celery_outbox@head")
    engine = create_engine(url)
    try:
        indexes = {i["name"]: i for i in inspect(engine).get_indexes(OUTBOX_TABLE)}
        if engine.dialect.name == "mysql":
            columns = {c["name"] for c in inspect(engine).get_columns(OUTBOX_TABLE)}
            assert schema.PENDING_TASK_COLUMN in columns
            assert indexes[schema.PENDING_TASK_INDEX]["unique"]
        else:
            assert indexes[schema.PENDING_TASK_INDEX]["unique"]
        if engine.dialect.name == "postgresql":
            found = snapshot(engine)
            assert found["fillfactor"] == [f"fillfactor={schema.FILLFACTOR}"]
            assert [name for name, _ in found["triggers"]] == [NOTIFY_TRIGGER]
            assert schema.PENDING_ROOT_INDEX in indexes
    finally:
        engine.dispose()


def test_base_removes_every_table_and_the_trigger_function(
    two_databases: tuple[str, str], tmp_path: Path
) -> None:
    url = two_databases[0]
    config = alembic_config(tmp_path, url)
    command.upgrade(config, "celery_outbox@head")
    command.downgrade(config, "celery_outbox@base")
    engine = create_engine(url)
    try:
        expected: dict[str, Any] = {"tables": []}
        if engine.dialect.name == "postgresql":
            expected["function"] = 0
        assert leftovers(engine) == expected
    finally:
        engine.dispose()


def test_the_revision_carries_the_statements_the_stores_run() -> None:
    """The revision's frozen copies equal the statements ``create_all`` and Django run
    today: a change to those must ship as a new revision.
    """
    revision = (Path(ALEMBIC_VERSIONS) / "celery_outbox_0001_tables.py").read_text()
    flat = " ".join(revision.replace('"\n    "', "").split())
    statements = [
        *schema.create_root_indexes(),
        schema.SET_FILLFACTOR,
        *CREATE_TRIGGER,
        *DROP_TRIGGER,
        schema.mysql_add_pending_key(),
    ]
    for statement in statements:
        assert " ".join(statement.split()) in flat, statement


@pytest.mark.django_db
def test_the_django_migrations_and_the_revisions_build_the_same_tables(
    postgres_database_url: str, tmp_path: Path
) -> None:
    from django.db import connection

    if connection.vendor != "postgresql":
        pytest.skip("the Django test database is not PostgreSQL (OUTBOX_TEST_DJANGO_DB)")
    settings = connection.settings_dict
    django_url = make_url(services.with_db_name(postgres_database_url, settings["NAME"])).set(
        drivername="postgresql+psycopg"
    )
    url = make_url(postgres_database_url).set(drivername="postgresql+psycopg")
    command.upgrade(
        alembic_config(tmp_path, url.render_as_string(hide_password=False)), "celery_outbox@head"
    )
    upgraded = create_engine(url)
    migrated = create_engine(django_url)
    try:
        assert snapshot(upgraded) == snapshot(migrated)
    finally:
        upgraded.dispose()
        migrated.dispose()
