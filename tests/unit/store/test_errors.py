"""The one error translation every store uses (:mod:`celery_outbox.store.errors`)."""

from __future__ import annotations

from collections.abc import Callable

import pytest

from celery_outbox.exceptions import StoreDataError, StoreError
from celery_outbox.store.errors import store_errors


class Refused(Exception):
    pass


class Down(Exception):
    pass


@pytest.mark.parametrize(("raised", "expected"), [(Refused, StoreDataError), (Down, StoreError)])
def test_driver_errors_leave_as_store_errors_with_the_cause(
    raised: type[Exception], expected: type[StoreError]
) -> None:
    with (
        pytest.raises(expected, match="could not write a row: driver says") as caught,
        store_errors("write a row", data=(Refused,), outage=(Down,)),
    ):
        raise raised("driver says")
    assert type(caught.value) is expected
    assert isinstance(caught.value.__cause__, raised)


def test_other_errors_pass_through() -> None:
    with pytest.raises(KeyError), store_errors("write a row", data=(Refused,), outage=(Down,)):
        raise KeyError("mine")


class RefusedByDriver(Down):
    """A driver's data error is one of its errors too (as with DB-API's hierarchy)."""


def test_a_data_error_is_told_apart_from_the_outage_it_subclasses() -> None:
    with (
        pytest.raises(StoreDataError),
        store_errors("write a row", data=(RefusedByDriver,), outage=(Down,)),
    ):
        raise RefusedByDriver("value too long")


def test_a_value_too_large_is_refused_data_whatever_class_the_driver_gives_it() -> None:
    import sqlite3

    import psycopg
    import pymysql
    from sqlalchemy import exc as sa_exc

    from celery_outbox.store.errors import refused_value

    packet = pymysql.err.OperationalError(1153, "Got a packet bigger than 'max_allowed_packet'")
    gone = pymysql.err.OperationalError(2006, "MySQL server has gone away")
    limit = psycopg.errors.ProgramLimitExceeded("index row size exceeds maximum")
    blob = sqlite3.DataError("string or blob too big")
    assert [refused_value(e) for e in (packet, limit, blob)] == [True, True, True]
    assert refused_value(gone) is False  # an outage: put back, never taken for data
    wrapped = sa_exc.OperationalError("INSERT ...", {}, packet)  # SQLAlchemy keeps .orig
    assert refused_value(wrapped) is True
    cause = RuntimeError("wrapped")  # Django chains the driver's error as __cause__
    cause.__cause__ = packet
    assert refused_value(cause) is True


def test_a_refused_value_leaves_the_store_as_a_data_error() -> None:
    import pymysql

    from celery_outbox.exceptions import StoreDataError
    from celery_outbox.store.errors import store_errors

    packet = pymysql.err.OperationalError(1153, "Got a packet bigger than 'max_allowed_packet'")
    translated = store_errors("write a letter", data=(ValueError,), outage=(pymysql.err.Error,))
    with pytest.raises(StoreDataError, match="could not write a letter"), translated:
        raise packet


def _mysql(code: int) -> Exception:
    import pymysql

    return pymysql.err.OperationalError(code, f"MySQL error {code}")


def _postgres(name: str) -> Exception:
    import psycopg

    error: Exception = getattr(psycopg.errors, name)(f"PostgreSQL {name}")
    return error


def _sqlite(kind: str, message: str) -> Exception:
    import sqlite3

    error: Exception = getattr(sqlite3, kind)(message)
    return error


@pytest.mark.parametrize(
    ("make", "refused"),
    [
        # MySQL/MariaDB numbers PyMySQL raises as OperationalError (its default class).
        pytest.param(lambda: _mysql(1118), True, id="mysql-1118-row-size-too-large"),
        pytest.param(lambda: _mysql(1153), True, id="mysql-1153-packet-too-big"),
        pytest.param(lambda: _mysql(1292), True, id="mysql-1292-incorrect-value"),
        pytest.param(lambda: _mysql(1301), True, id="mysql-1301-result-over-packet"),
        pytest.param(lambda: _mysql(1406), True, id="mysql-1406-data-too-long"),
        pytest.param(lambda: _mysql(3140), True, id="mysql-3140-invalid-json"),
        pytest.param(lambda: _mysql(4025), True, id="mariadb-4025-check-constraint"),
        pytest.param(lambda: _mysql(2006), False, id="mysql-2006-server-gone-away"),
        pytest.param(lambda: _mysql(2013), False, id="mysql-2013-lost-connection"),
        pytest.param(lambda: _mysql(1205), False, id="mysql-1205-lock-wait-timeout"),
        pytest.param(lambda: _mysql(1213), False, id="mysql-1213-deadlock"),
        # PostgreSQL: SQLSTATE class 54, program limits, raised as OperationalError.
        pytest.param(lambda: _postgres("ProgramLimitExceeded"), True, id="pg-54000"),
        pytest.param(lambda: _postgres("StatementTooComplex"), True, id="pg-54001"),
        pytest.param(lambda: _postgres("TooManyColumns"), True, id="pg-54011"),
        pytest.param(lambda: _postgres("TooManyArguments"), True, id="pg-54023"),
        pytest.param(lambda: _postgres("AdminShutdown"), False, id="pg-57P01-shutdown"),
        pytest.param(lambda: _postgres("CannotConnectNow"), False, id="pg-57P03-starting"),
        pytest.param(lambda: _postgres("SerializationFailure"), False, id="pg-40001"),
        # SQLite: DataError since Python 3.11, OperationalError before.
        pytest.param(lambda: _sqlite("DataError", "string or blob too big"), True, id="sqlite"),
        pytest.param(
            lambda: _sqlite("OperationalError", "string or blob too big"), True, id="sqlite-old"
        ),
        pytest.param(
            lambda: _sqlite("OperationalError", "database is locked"), False, id="sqlite-locked"
        ),
    ],
)
def test_each_vendors_refusals_are_data_and_its_outages_are_not(
    make: Callable[[], Exception], refused: bool
) -> None:
    from celery_outbox.store.errors import refused_value

    assert refused_value(make()) is refused
