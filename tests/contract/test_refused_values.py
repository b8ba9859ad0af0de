"""A value a database refuses for its size is data (``StoreDataError``), never an outage,
on every database and both stores (issue 43), whatever class its driver gives the error:
MySQL/MariaDB 1301 (``OperationalError``), PostgreSQL SQLSTATE 54000
(``ProgramLimitExceeded``, an ``OperationalError``), SQLite "string or blob too big".

Each case is a real round trip: the server refuses, the store's boundary translates, and
the next statement on the same store works. (1153, a statement over
``max_allowed_packet``, is in ``tests/django/test_oversized_dead_letter_e2e.py``, on a
MariaDB of its own; the drivers' classes with each code are in
``tests/unit/store/test_errors.py``.)
"""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest

pytest.importorskip("sqlalchemy")

from sqlalchemy import create_engine, event, text

from celery_outbox.exceptions import StoreDataError
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, metadata
from celery_outbox.sqlalchemy.types import store_errors
from tests.contract.factories import new_dead_letter
from tests.django.refused_client import REFUSING, code_of
from tests.django.test_other_databases import run_django

#: The driver's code of each server's refusal.
CODES = {"postgresql": "54000", "mysql": 1301}


def refuse(engine: Any, dialect: str) -> None:
    """Run the server's refusing statement inside the SQLAlchemy store's boundary."""
    with store_errors("write a value"), engine.connect() as conn:
        if dialect == "mysql":
            conn.execute(text("CREATE TEMPORARY TABLE refused (v LONGTEXT)"))
        conn.execute(text(REFUSING[dialect]))


@pytest.mark.parametrize(
    "dialect", [pytest.param("postgresql", marks=pytest.mark.postgres), "mysql"]
)
def test_a_value_too_large_for_the_server_is_refused_data_by_the_sqlalchemy_store(
    request: pytest.FixtureRequest, dialect: str
) -> None:
    engine = request.getfixturevalue(f"sa_{dialect}_engine")
    store = SQLAlchemyOutboxStore(engine=engine)
    with pytest.raises(StoreDataError) as caught:
        refuse(engine, dialect)
    assert code_of(caught.value.__cause__.orig) == CODES[dialect]  # type: ignore[union-attr]
    letter_id = store.add_dead_letter(new_dead_letter())  # the store goes on
    assert store.get_dead_letter(letter_id) is not None
    with engine.begin() as conn:
        conn.execute(store.tables.dead_letter.delete())


def test_a_letter_over_sqlites_length_limit_is_refused_data_by_the_sqlalchemy_store(
    tmp_path: Path,
) -> None:
    engine = create_engine(f"sqlite:///{tmp_path / 'small.sqlite3'}")

    @event.listens_for(engine, "connect")
    def small(dbapi_connection: sqlite3.Connection, _: Any) -> None:
        dbapi_connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 10_000)

    metadata.create_all(engine)
    store = SQLAlchemyOutboxStore(engine=engine)
    with pytest.raises(StoreDataError, match="string or blob too big"):
        store.add_dead_letter(new_dead_letter(exception_message="x" * 20_000))
    assert store.get_dead_letter(store.add_dead_letter(new_dead_letter())) is not None
    engine.dispose()


@pytest.mark.parametrize("vendor", ["postgresql", "mysql", "sqlite"])
def test_a_value_too_large_for_the_server_is_refused_data_by_the_django_store(
    request: pytest.FixtureRequest, tmp_path: Path, vendor: str
) -> None:
    if vendor == "sqlite":
        url = f"sqlite:///{tmp_path / 'outbox.sqlite3'}"
    else:
        prefix = "postgres" if vendor == "postgresql" else vendor
        url = str(request.getfixturevalue(f"{prefix}_database_url"))
    env = {"OUTBOX_DJANGO_DB_URL": url}
    run_django(["django", "migrate", "--noinput", "-v", "0"], env)
    outcome = json.loads(run_django(["tests.django.refused_client"], env))
    expected = {
        "postgresql": ("ProgramLimitExceeded", "54000"),
        "mysql": ("OperationalError", 1301),
        "sqlite": ("DataError", "string or blob too big"),
    }[vendor]
    assert outcome["vendor"] == vendor
    assert outcome["error"] == "StoreDataError"
    assert (outcome["cause"], outcome["code"]) == expected
    assert outcome["then"] is True  # the store goes on, on the same connection or a new one
