"""What wakes the relay loop early: PostgreSQL ``NOTIFY``, and the next parked row's due time.

A row written without a lease has no on-commit publisher: with ``outbox_publish_grace``
at 0, a parked retry, a countdown longer than ``outbox_park_after``. On PostgreSQL a
trigger on the outbox table (:data:`CREATE_TRIGGER`, made by the Django migration
``0008_notify_trigger`` and by the SQLAlchemy table's DDL) sends a ``NOTIFY`` on
:data:`CHANNEL` when such a row is inserted. Rows born leased to their on-commit
publisher (the common case) cost the trigger only its ``WHEN`` test: no notification, no
notify lock at commit. PostgreSQL delivers a notification at ``COMMIT`` (never for a
rolled-back row) and merges identical ones, so a transaction writing 100 such rows
sends one. The relay LISTENs (:class:`celery_outbox.listener.Wakeups`) and sweeps as
soon as one arrives.

Parked rows coming due need a timer, not a notification: after an idle pass the relay
sleeps until :meth:`WakeupStore.next_due` (bounded by its poll interval).
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from celery_outbox.records import OUTBOX_TABLE

#: The channel the trigger notifies and the relay listens on.
CHANNEL = "celery_outbox"
#: The trigger function and the trigger (PostgreSQL).
NOTIFY_FUNCTION = "celery_outbox_notify"
NOTIFY_TRIGGER = "celery_outbox_notify_insert"

#: Creates (or replaces) the trigger: each statement separately, for any driver.
CREATE_TRIGGER = (
    f"CREATE OR REPLACE FUNCTION {NOTIFY_FUNCTION}() RETURNS trigger LANGUAGE plpgsql AS "
    f"$$ BEGIN PERFORM pg_notify('{CHANNEL}', ''); RETURN NULL; END $$",
    f"DROP TRIGGER IF EXISTS {NOTIFY_TRIGGER} ON {OUTBOX_TABLE}",
    # A row-level trigger so that WHEN can skip rows born leased; EXECUTE PROCEDURE is
    # the spelling every supported PostgreSQL accepts.
    f"CREATE TRIGGER {NOTIFY_TRIGGER} AFTER INSERT ON {OUTBOX_TABLE} FOR EACH ROW "
    f"WHEN (NEW.locked_until IS NULL) EXECUTE PROCEDURE {NOTIFY_FUNCTION}()",
)
#: Removes the trigger and its function.
DROP_TRIGGER = (
    f"DROP TRIGGER IF EXISTS {NOTIFY_TRIGGER} ON {OUTBOX_TABLE}",
    f"DROP FUNCTION IF EXISTS {NOTIFY_FUNCTION}()",
)

#: Opens a new DB-API connection to LISTEN on (psycopg 3 or psycopg2), outside any pool.
Connector = Callable[[], Any]


class WakeupStore:
    """The store's part in waking the relay; the defaults mean "poll" (no NOTIFY, no timer)."""

    def next_due(self, *, after: datetime, using: str | None = None) -> datetime | None:
        """The earliest ``available_at`` later than ``after`` of a ``pending`` row (a parked
        retry or countdown, a row rescheduled after a failed publish), or ``None``.

        One probe of the due-row index. The relay sleeps until then when that is sooner
        than its poll interval.
        """
        return None

    def listen_connector(self, *, using: str | None = None) -> Connector | None:
        """How to open a connection to LISTEN on for database ``using`` (a new one,
        outside any pool or transaction management), or ``None`` where the database has
        no ``NOTIFY`` (the relay polls)."""
        return None
