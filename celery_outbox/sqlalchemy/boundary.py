"""What crosses the store boundary: driver errors go out as ``StoreError``, and naive
datetimes are refused on the way in, before any SQL runs."""

from __future__ import annotations

from contextlib import AbstractContextManager
from datetime import datetime

from sqlalchemy import exc as sa_exc

from celery_outbox.records import check_aware
from celery_outbox.store_errors import store_errors as translated

#: Values the database refuses: :class:`~celery_outbox.exceptions.StoreDataError`.
DATA_ERRORS = (sa_exc.DataError, sa_exc.IntegrityError)
#: Driver and pool errors: :class:`~celery_outbox.exceptions.StoreError`.
OUTAGE_ERRORS = (sa_exc.DBAPIError, sa_exc.TimeoutError)


def store_errors(action: str) -> AbstractContextManager[None]:
    """Raise SQLAlchemy's errors as the core's (:mod:`celery_outbox.store_errors`)."""
    return translated(action, data=DATA_ERRORS, outage=OUTAGE_ERRORS)


def require_aware(**values: datetime | None) -> None:
    """Raise ``ValueError`` naming the first naive datetime among ``values``."""
    for name, value in values.items():
        if value is not None:
            check_aware(name, value)
