"""Driver errors leave every store the same way: :class:`StoreError` or :class:`StoreDataError`.

Each store names its driver's exception classes once and wraps each operation in
:func:`store_errors`; the message and the chaining are the same for all of them.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager

from celery_outbox.exceptions import StoreDataError, StoreError

ErrorTypes = tuple[type[BaseException], ...]

#: MySQL/MariaDB error numbers of a value the server refuses, which drivers raise as
#: ``OperationalError`` (PyMySQL raises every number it does not map that way): 1118 a
#: row too large, 1153 a statement over ``max_allowed_packet``, 1292 an incorrect value,
#: 1301 a result over ``max_allowed_packet``, 1406 data too long for its column, 3140
#: invalid JSON (MySQL), 4025 a CHECK constraint failed (MariaDB's ``JSON_VALID``).
MYSQL_REFUSED = frozenset({1118, 1153, 1292, 1301, 1406, 3140, 4025})
#: PostgreSQL's SQLSTATE class of program limits exceeded (a value or row too large).
POSTGRES_REFUSED_CLASS = "54"


def refused_value(exc: BaseException) -> bool:
    """Whether a driver error whose class says outage is a value the database refuses:
    MySQL/MariaDB :data:`MYSQL_REFUSED`, PostgreSQL SQLSTATE class 54, SQLite's "string
    or blob too big". Writing the same value again fails the same way.
    """
    for error in (exc, getattr(exc, "orig", None), exc.__cause__):
        if error is None:
            continue
        args = getattr(error, "args", ())
        if args and isinstance(args[0], int) and args[0] in MYSQL_REFUSED:
            return True
        state = getattr(error, "sqlstate", None) or getattr(error, "pgcode", None)
        if isinstance(state, str) and state.startswith(POSTGRES_REFUSED_CLASS):
            return True
        if "string or blob too big" in str(error):
            return True
    return False


def _never(exc: BaseException) -> bool:
    return False


def _nothing() -> None:
    return None


@contextmanager
def store_errors(
    action: str,
    *,
    data: ErrorTypes,
    outage: ErrorTypes,
    unless: Callable[[BaseException], bool] = _never,
    after_refused: Callable[[], None] = _nothing,
) -> Iterator[None]:
    """Raise a ``data`` error (a value the database refuses: not an outage, the same
    write fails again) as :class:`StoreDataError`, an ``outage`` error (driver, pool)
    as :class:`StoreError` (unless :func:`refused_value` says it is a value refused,
    after which ``after_refused`` runs: a store drops the connections it broke).

    The cause is chained and never swallowed, so the caller's transaction still rolls
    back; an error ``unless`` accepts (a task body's own) leaves unchanged. ``action``
    completes "celery-outbox could not ...".
    """
    try:
        yield
    except data as exc:
        if unless(exc):
            raise
        raise StoreDataError(f"celery-outbox could not {action}: {exc}") from exc
    except outage as exc:
        if unless(exc):
            raise
        if refused_value(exc):
            after_refused()
            raise StoreDataError(f"celery-outbox could not {action}: {exc}") from exc
        raise StoreError(f"celery-outbox could not {action}: {exc}") from exc
