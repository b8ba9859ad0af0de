"""What crosses the store boundary: driver errors go out as ``StoreError``, and naive
datetimes are refused on the way in, before any SQL runs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime

from sqlalchemy import exc as sa_exc

from celery_outbox.exceptions import StoreDataError, StoreError
from celery_outbox.records import check_aware


@contextmanager
def store_errors(action: str) -> Iterator[None]:
    """Raise a driver or pool error as :class:`StoreError`, keeping the cause; a value
    the database refuses as :class:`StoreDataError` (not an outage)."""
    try:
        yield
    except (sa_exc.DataError, sa_exc.IntegrityError) as exc:
        raise StoreDataError(f"celery-outbox could not {action}: {exc}") from exc
    except (sa_exc.DBAPIError, sa_exc.TimeoutError) as exc:
        raise StoreError(f"celery-outbox could not {action}: {exc}") from exc


def require_aware(**values: datetime | None) -> None:
    """Raise ``ValueError`` naming the first naive datetime among ``values``."""
    for name, value in values.items():
        if value is not None:
            check_aware(name, value)
