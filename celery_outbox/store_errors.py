"""Driver errors leave every store the same way: :class:`StoreError` or :class:`StoreDataError`.

Each store names its driver's exception classes once and wraps each operation in
:func:`store_errors`; the message and the chaining are the same for all of them.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from celery_outbox.exceptions import StoreDataError, StoreError

ErrorTypes = tuple[type[BaseException], ...]


@contextmanager
def store_errors(action: str, *, data: ErrorTypes, outage: ErrorTypes) -> Iterator[None]:
    """Raise a ``data`` error (a value the database refuses: not an outage, the same
    write fails again) as :class:`StoreDataError`, an ``outage`` error (driver, pool)
    as :class:`StoreError`; the cause is chained and never swallowed, so the caller's
    transaction still rolls back. ``action`` completes "celery-outbox could not ..."."""
    try:
        yield
    except data as exc:
        raise StoreDataError(f"celery-outbox could not {action}: {exc}") from exc
    except outage as exc:
        raise StoreError(f"celery-outbox could not {action}: {exc}") from exc
