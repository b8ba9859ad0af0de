"""The relay loop's wait: a ``LISTEN`` on each PostgreSQL database, polling as the fallback.

:class:`Wakeups` holds one connection per database that has ``NOTIFY``
(:meth:`~celery_outbox.wakeups.WakeupStore.listen_connector`), in autocommit, listening
on :data:`~celery_outbox.wakeups.CHANNEL`. Its :meth:`~Wakeups.wait` returns as soon as a
notification arrives on any of them, when the timeout passes, or soon after ``stop`` is
set. A connection that cannot be opened or is lost (a restart, ``pg_terminate_backend``)
is logged and dropped; the wait falls back to the plain timeout and tries to LISTEN again
every :data:`RETRY_LISTEN` seconds. A new LISTEN wakes the loop at once: rows may have
been written while nobody listened. No row depends on a notification: the sweep that
follows a wake-up, a timeout or a reconnection finds every due row.
"""

from __future__ import annotations

import contextlib
import select
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

from celery_outbox.exceptions import StoreError
from celery_outbox.long_text import bounded_logger
from celery_outbox.wakeups import CHANNEL, Connector, WakeupStore

logger = bounded_logger(__name__)

#: Longest wait on the sockets before ``stop`` is looked at again (seconds).
STOP_CHECK = 0.25
#: Seconds between two attempts to LISTEN after one failed or a connection was lost.
RETRY_LISTEN = 5.0


class Wakeups:
    """Waits for a ``NOTIFY`` on any of ``connectors``' databases, or for a timeout.

    Parameters
    ----------
    connectors
        One per database with ``NOTIFY``; each opens a new DB-API connection (psycopg 3
        or psycopg2). None: :meth:`wait` is a plain timed wait.
    retry
        Seconds between attempts to LISTEN again.
    clock
        A monotonic clock (seconds).
    """

    def __init__(
        self,
        connectors: Sequence[Connector] = (),
        *,
        retry: float = RETRY_LISTEN,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.retry, self.clock = retry, clock
        self._slots = [_Slot(connect) for connect in connectors]

    @property
    def listening(self) -> int:
        """How many databases are listened on now."""
        return sum(1 for slot in self._slots if slot.connection is not None)

    def wait(self, timeout: float, stop: threading.Event) -> bool:
        """Wait up to ``timeout`` seconds; whether a notification or a new LISTEN ended it."""
        if self._listen():
            return True
        live = [slot for slot in self._slots if slot.connection is not None]
        if not live:
            stop.wait(timeout)
            return False
        deadline = self.clock() + timeout
        while not stop.is_set():
            left = deadline - self.clock()
            if left <= 0:
                return False
            try:
                ready, _, _ = select.select(live, [], [], min(left, STOP_CHECK))
            except (OSError, ValueError):  # a socket closed under us: reading says how
                ready = live
            if ready:
                for slot in ready:
                    slot.drain(self.clock() + self.retry)
                return True
        return False

    def close(self) -> None:
        """Close every LISTEN connection."""
        for slot in self._slots:
            slot.close()

    def _listen(self) -> bool:
        """LISTEN on each database not listened on whose retry time has come; whether one
        started (the caller sweeps: rows may have come while nobody listened)."""
        now, started = self.clock(), False
        for slot in self._slots:
            if slot.connection is None and now >= slot.retry_at:
                started = slot.listen(now=now, retry=self.retry) or started
        return started


def listen_connectors(store: WakeupStore, aliases: Sequence[str | None]) -> list[Connector]:
    """The LISTEN connectors of those of ``aliases`` whose database has ``NOTIFY``; a
    database the store cannot name (an alias removed from settings) is left to polling,
    and its sweeps report the error."""
    found: list[Connector] = []
    for alias in aliases:
        try:
            connect = store.listen_connector(using=alias)
        except StoreError:
            logger.warning("celery-outbox: cannot LISTEN on %r; polling it", alias, exc_info=True)
            continue
        if connect is not None:
            found.append(connect)
    return found


class _Slot:
    """One database's LISTEN connection, or the time to try again."""

    def __init__(self, connect: Connector) -> None:
        self.connect = connect
        self.connection: Any = None
        self.retry_at = 0.0
        self.failing = False

    def fileno(self) -> int:
        return int(self.connection.fileno())

    def listen(self, *, now: float, retry: float) -> bool:
        connection = None
        try:
            connection = self.connect()
            connection.autocommit = True
            if hasattr(connection, "add_notify_handler"):  # psycopg 3: keep no backlog
                connection.add_notify_handler(_ignore)
            connection.fileno()  # a driver without a socket to wait on cannot LISTEN here
            _execute(connection, f'LISTEN "{CHANNEL}"')
        except Exception as exc:  # noqa: BLE001 - any driver's error: poll instead
            if connection is not None:
                with contextlib.suppress(Exception):
                    connection.close()
            self.retry_at = now + retry
            if not self.failing:
                logger.warning(
                    "celery-outbox: cannot LISTEN for new outbox rows (%s); polling, "
                    "trying again every %g s",
                    exc,
                    retry,
                )
            self.failing = True
            return False
        if self.failing:
            logger.warning("celery-outbox: listening for new outbox rows again")
        self.connection, self.failing = connection, False
        return True

    def drain(self, retry_at: float) -> None:
        """Read what arrived (the notifications are not needed: a sweep follows); a
        connection that fails here is lost: close it and poll until the next LISTEN.

        A statement, not psycopg 3's ``notifies(timeout=0)``: that one returns nothing,
        without an error, from a connection whose backend was terminated, whose socket
        then stays readable for ever."""
        try:
            _execute(self.connection, "SELECT 1")
            notifies = getattr(self.connection, "notifies", None)
            if isinstance(notifies, list):  # psycopg2 keeps them in a list
                notifies.clear()
        except Exception as exc:  # noqa: BLE001 - any driver's error: poll instead
            logger.warning(
                "celery-outbox: lost the LISTEN connection (%s); polling until it is back", exc
            )
            self.close()
            self.retry_at, self.failing = retry_at, True

    def close(self) -> None:
        connection, self.connection = self.connection, None
        if connection is not None:
            with contextlib.suppress(Exception):
                connection.close()


def _execute(connection: Any, sql: str) -> None:
    cursor = connection.cursor()
    try:
        cursor.execute(sql)
        if cursor.description is not None:
            cursor.fetchall()
    finally:
        cursor.close()


def _ignore(_notify: object) -> None:
    """psycopg 3's handler: with one, notifications are not kept for ``notifies()``."""
