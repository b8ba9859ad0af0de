"""Column types and the store boundary of the SQLAlchemy store.

Column types that behave the same on PostgreSQL, MySQL/MariaDB and SQLite.

What crosses the store boundary: driver errors go out as ``StoreError``, and naive
datetimes are refused on the way in, before any SQL runs.
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime, timezone
from typing import Any

from sqlalchemy import JSON, BigInteger, DateTime, Integer
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import mysql, postgresql
from sqlalchemy.engine import Dialect
from sqlalchemy.types import TypeDecorator, TypeEngine

from celery_outbox.store.errors import store_errors as translated
from celery_outbox.store.records import check_aware

# --- Column types that behave the same on PostgreSQL, MySQL/MariaDB and SQLite.

#: Primary keys: ``bigint``, but ``INTEGER`` on SQLite, where only that autoincrements.
BigIdType: TypeEngine[int] = BigInteger().with_variant(Integer(), "sqlite")

#: JSON documents: ``jsonb`` on PostgreSQL, the dialect's JSON elsewhere.
JSONType: TypeEngine[Any] = JSON().with_variant(postgresql.JSONB(), "postgresql")

_NAIVE_UTC_DIALECTS = frozenset({"sqlite", "mysql", "mariadb"})


class UTCDateTime(TypeDecorator[datetime]):
    """A ``timestamp with time zone`` that takes and gives aware UTC datetimes.

    PostgreSQL stores the instant. SQLite and MySQL have no time zone type, so the
    value is stored as naive UTC and read back as aware UTC; on MySQL with
    microseconds (``DATETIME(6)``), because a claim's lease is compared for equality.
    Naive datetimes are refused: they would be stored in whatever zone they meant.
    """

    impl = DateTime(timezone=True)
    cache_ok = True

    def load_dialect_impl(self, dialect: Dialect) -> TypeEngine[Any]:
        if dialect.name in ("mysql", "mariadb"):
            return dialect.type_descriptor(mysql.DATETIME(fsp=6))
        return dialect.type_descriptor(DateTime(timezone=True))

    def process_bind_param(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        utc = check_aware("datetime", value).astimezone(timezone.utc)
        return utc.replace(tzinfo=None) if dialect.name in _NAIVE_UTC_DIALECTS else utc

    def process_result_value(self, value: datetime | None, dialect: Dialect) -> datetime | None:
        if value is None:
            return None
        if value.tzinfo is None:
            return value.replace(tzinfo=timezone.utc)
        return value.astimezone(timezone.utc)


# --- What crosses the store boundary: driver errors go out as ``StoreError``, and naive

#: Values the database refuses: :class:`~celery_outbox.exceptions.StoreDataError`.
DATA_ERRORS = (sa_exc.DataError, sa_exc.IntegrityError)

#: Driver and pool errors: :class:`~celery_outbox.exceptions.StoreError`.
OUTAGE_ERRORS = (sa_exc.DBAPIError, sa_exc.TimeoutError)


def store_errors(action: str) -> AbstractContextManager[None]:
    """Raise SQLAlchemy's errors as the core's (:mod:`celery_outbox.store.errors`)."""
    return translated(action, data=DATA_ERRORS, outage=OUTAGE_ERRORS)


def require_aware(**values: datetime | None) -> None:
    """Raise ``ValueError`` naming the first naive datetime among ``values``."""
    for name, value in values.items():
        if value is not None:
            check_aware(name, value)
