"""The one error translation every store uses (:mod:`celery_outbox.store_errors`)."""

from __future__ import annotations

import pytest

from celery_outbox.exceptions import StoreDataError, StoreError
from celery_outbox.store_errors import store_errors


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

    from celery_outbox.store_errors import refused_value

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
    from celery_outbox.store_errors import store_errors

    packet = pymysql.err.OperationalError(1153, "Got a packet bigger than 'max_allowed_packet'")
    translated = store_errors("write a letter", data=(ValueError,), outage=(pymysql.err.Error,))
    with pytest.raises(StoreDataError, match="could not write a letter"), translated:
        raise packet
