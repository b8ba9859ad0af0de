"""The ``harness`` fixture: every contract test runs once per store.

Stores: ``memory``; ``sqlalchemy-sqlite`` (a file per test); ``sqlalchemy-postgresql``
and ``sqlalchemy-mysql`` (one database per run, emptied before each test); ``django``
(PostgreSQL through pytest-django's ``transactional_db``, skipped without Django).
"""

from __future__ import annotations

import importlib.util
from collections.abc import Iterator
from typing import Any

import pytest

from tests import services
from tests.contract.harness import DjangoHarness, Harness, MemoryHarness, SQLAlchemyHarness


def _django_marks() -> list[pytest.MarkDecorator]:
    # pytest-django picks transactional_db from the marker (a dynamically requested
    # ``transactional_db`` would still get the rolled-back ``db`` flavour).
    marks = [pytest.mark.postgres]
    if importlib.util.find_spec("pytest_django") is not None:
        marks.append(pytest.mark.django_db(transaction=True))
    return marks


STORES = [
    pytest.param("memory", id="memory"),
    pytest.param("sqlalchemy-sqlite", id="sqlalchemy-sqlite"),
    pytest.param("sqlalchemy-postgresql", id="sqlalchemy-postgresql", marks=pytest.mark.postgres),
    pytest.param("sqlalchemy-mysql", id="sqlalchemy-mysql", marks=pytest.mark.mysql),
    pytest.param("django", id="django", marks=_django_marks()),
]


def _need(module: str) -> None:
    if importlib.util.find_spec(module) is None:
        pytest.skip(f"{module} is not installed")


def _server_engine(url: str, *, driver: str, create: Any, drop: Any) -> Iterator[Any]:
    """An engine on a fresh database of the server at ``url``, with the tables created."""
    _need("sqlalchemy")
    from sqlalchemy import create_engine
    from sqlalchemy.engine import make_url

    from celery_outbox.sqlalchemy import metadata

    name = services.unique_name("outbox_contract_")
    create(url, name)
    engine = create_engine(
        make_url(services.with_db_name(url, name)).set(drivername=driver), pool_size=10
    )
    metadata.create_all(engine)
    yield engine
    engine.dispose()
    drop(url, name)


@pytest.fixture(scope="session")
def sa_postgresql_engine(postgres_url: str) -> Iterator[Any]:
    yield from _server_engine(
        postgres_url,
        driver="postgresql+psycopg",
        create=services.create_postgres_database,
        drop=services.drop_postgres_database,
    )


@pytest.fixture(scope="session")
def sa_mysql_engine(mysql_url: str) -> Iterator[Any]:
    yield from _server_engine(
        mysql_url,
        driver="mysql+pymysql",
        create=services.create_mysql_database,
        drop=services.drop_mysql_database,
    )


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def engine(request: pytest.FixtureRequest) -> Iterator[Any]:
    """A SQLAlchemy engine with the outbox tables, on SQLite and on PostgreSQL, emptied
    after each test (a file that needs other databases defines its own).
    """
    made = request.getfixturevalue(f"sa_{request.param}_engine")
    yield made
    _empty(made)


@pytest.fixture
def pg_engine(sa_postgresql_engine: Any) -> Iterator[Any]:
    """The PostgreSQL engine of :func:`engine` alone, emptied after each test."""
    yield sa_postgresql_engine
    _empty(sa_postgresql_engine)


def _empty(engine: Any) -> None:
    from celery_outbox.sqlalchemy import metadata

    with engine.begin() as conn:
        for table in metadata.sorted_tables:
            conn.execute(table.delete())


@pytest.fixture
def sa_sqlite_engine(sqlite_url: str) -> Iterator[Any]:
    _need("sqlalchemy")
    from sqlalchemy import create_engine

    from celery_outbox.sqlalchemy import metadata

    engine = create_engine(sqlite_url, connect_args={"timeout": 30})
    metadata.create_all(engine)
    yield engine
    engine.dispose()


def _django_harness(request: pytest.FixtureRequest) -> Harness:
    _need("django")
    _need("django_outbox.store")
    if not request.config.pluginmanager.has_plugin("django"):
        pytest.skip("pytest-django is not active")
    return DjangoHarness()


@pytest.fixture(params=STORES)
def harness(request: pytest.FixtureRequest) -> Iterator[Harness]:
    """The store under test, in its own world, emptied."""
    kind = str(request.param)
    if kind == "memory":
        made: Harness = MemoryHarness()
    elif kind == "django":
        made = _django_harness(request)
    else:
        engine = request.getfixturevalue(f"sa_{kind.removeprefix('sqlalchemy-')}_engine")
        made = SQLAlchemyHarness(engine)
    made.clear()
    yield made
    made.clear()
