"""The on-commit publisher's deletes, off the request's path (PostgreSQL).

A transaction that wrote outbox rows publishes them right after its COMMIT; their
fenced ``DELETE`` then goes to a thread of the process
(:class:`celery_outbox.published_rows.PublishedRows`, one per database alias), which
deletes the rows of the commits of the next :data:`~celery_outbox.published_rows.FLUSH_AFTER`
seconds with one statement. The request pays its ``INSERT`` and the publish, not a third
round trip. The thread uses a connection of its own (Django's connections belong to their
thread), closed after :data:`~celery_outbox.published_rows.IDLE_AFTER` seconds without
rows. :func:`settle` deletes what waits and closes it at once: a test suite calls it
before its test database is dropped (the bundled pytest plugin does).
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Sequence
from datetime import datetime

from django.db import connections

from celery_outbox.published_rows import PublishedRows
from django_outbox.store import sql

_ROWS: dict[str, PublishedRows] = {}
_LOCK = threading.Lock()


def rows_of(alias: str) -> PublishedRows:
    """The published rows of database ``alias`` waiting for their ``DELETE``."""
    rows = _ROWS.get(alias)
    if rows is None:
        with _LOCK:
            rows = _ROWS.get(alias)
            if rows is None:
                rows = _ROWS[alias] = PublishedRows(
                    functools.partial(_delete, alias),
                    release=functools.partial(_close, alias),
                )
    return rows


def settle(timeout: float = 5.0) -> bool:
    """Delete every published row still waiting, in every database, and close the
    deleting threads' connections; whether all of them did within ``timeout`` seconds."""
    return all([rows.settle(timeout) for rows in list(_ROWS.values())])


def _delete(alias: str, ids: Sequence[int], leases: Sequence[datetime]) -> None:
    try:
        sql.delete_leased(ids, leases, alias=alias)
    except Exception:
        _close(alias)  # the next flush starts on a fresh connection
        raise


def _close(alias: str) -> None:
    connections[alias].close()
