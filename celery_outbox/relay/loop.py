"""The relay loop, and its wait: LISTEN on PostgreSQL, polling elsewhere.

The relay loop's wait: a ``LISTEN`` on each PostgreSQL database, polling as the fallback.

:class:`Wakeups` holds one connection per database that has ``NOTIFY``
(:meth:`~celery_outbox.store.base.WakeupStore.listen_connector`), in autocommit, listening
on :data:`~celery_outbox.store.base.CHANNEL`. Its :meth:`~Wakeups.wait` returns as soon as a
notification arrives on any of them, when the timeout passes, or soon after ``stop`` is
set. A connection that cannot be opened or is lost (a restart, ``pg_terminate_backend``)
is logged and dropped; the wait falls back to the plain timeout and tries to LISTEN again
every :data:`RETRY_LISTEN` seconds. A new LISTEN wakes the loop at once: rows may have
been written while nobody listened. No row depends on a notification: the sweep that
follows a wake-up, a timeout or a reconnection finds every due row.

The relay loop (``outbox relay``, ``Sweeper.run``): sweep, then wait for a reason to sweep.

A pass sweeps every alias; maintenance (purging published rows past
``outbox_keep_published``, completed atomic tasks and chord joins past
``outbox_keep_completed``) runs at most once per ``outbox_sweep_interval``, so a pass
woken for one new row pays its claim and publish, not two ``DELETE`` statements. After a
pass that left nothing due, the loop waits until the first of: a PostgreSQL ``NOTIFY``
(:class:`~celery_outbox.relay.loop.Wakeups`), the next parked row's due time
(``store.next_due``), ``poll`` seconds. A store error is logged and the loop pauses,
doubling from ``poll`` up to :data:`MAX_ERROR_BACKOFF`.
"""

from __future__ import annotations

import contextlib
import select
import threading
import time
from collections.abc import Callable, Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from celery_outbox.config import OutboxConfig
from celery_outbox.exceptions import StoreError
from celery_outbox.long_text import bounded_logger
from celery_outbox.relay.relay import Relay
from celery_outbox.store.base import CHANNEL, Connector, OutboxStore, WakeupStore

logger = bounded_logger(__name__)


# --- The relay loop's wait: a ``LISTEN`` on each PostgreSQL database, polling as the fallback.

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
        self.retry = retry
        self.clock = clock
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
        started (the caller sweeps: rows may have come while nobody listened).
        """
        now = self.clock()
        started = False
        for slot in self._slots:
            if slot.connection is None and now >= slot.retry_at:
                started = slot.listen(now=now, retry=self.retry) or started
        return started


def listen_connectors(store: WakeupStore, aliases: Sequence[str | None]) -> list[Connector]:
    """The LISTEN connectors of those of ``aliases`` whose database has ``NOTIFY``; a
    database the store cannot name (an alias removed from settings) is left to polling,
    and its sweeps report the error.
    """
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
        self.connection = connection
        self.failing = False
        return True

    def drain(self, retry_at: float) -> None:
        """Read what arrived (the notifications are not needed: a sweep follows); a
        connection that fails here is lost: close it and poll until the next LISTEN.

        A statement, not psycopg 3's ``notifies(timeout=0)``: that one returns nothing,
        without an error, from a connection whose backend was terminated, whose socket
        then stays readable for ever.
        """
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
            self.retry_at = retry_at
            self.failing = True

    def close(self) -> None:
        connection = self.connection
        self.connection = None
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


# --- The relay loop (``outbox relay``, ``Sweeper.run``): sweep, then wait for a reason to sweep.

#: Longest pause of the loop after a store error (it doubles from ``poll``).
MAX_ERROR_BACKOFF = timedelta(seconds=30)


class Sweeps(Protocol):
    """What the loop needs of a :class:`~celery_outbox.relay.sweeper.Sweeper`."""

    store: OutboxStore
    relay: Relay
    config: OutboxConfig

    def now(self, using: str | None = None) -> datetime: ...
    def sweep(self, using: str | None = None, *, path: Any = "sweep") -> Any: ...
    def purge_expired(self, using: str | None = None) -> Any: ...
    def purge_completed(self, using: str | None = None) -> Any: ...


class RelayLoop:
    """Runs ``sweeper``'s passes until stopped; ``listen``: LISTEN where there is NOTIFY."""

    def __init__(self, sweeper: Sweeps, *, listen: bool = True) -> None:
        self.sweeper = sweeper
        self.listen = listen
        self._purged: datetime | None = None
        #: Each database's clock when its last sweep began (see :meth:`_until_due`).
        self._swept_at: dict[str | None, datetime] = {}

    def run(
        self,
        stop: threading.Event,
        poll: float | timedelta,
        *,
        aliases: Sequence[str | None] | None = None,
    ) -> None:
        """Sweep ``aliases`` (default: every alias of the store) until ``stop`` is set;
        the broker and LISTEN connections are released when it ends.
        """
        sweeper = self.sweeper
        idle = poll.total_seconds() if isinstance(poll, timedelta) else float(poll)
        names = sweeper.store.sweep_aliases() if aliases is None else aliases
        wakeups = Wakeups(listen_connectors(sweeper.store, names) if self.listen else ())
        errors = 0
        try:
            while not stop.is_set():
                pause, errors = self._pass(idle, errors, names)
                if errors:
                    stop.wait(pause)
                elif pause > 0:
                    wakeups.wait(self._until_due(pause, names), stop)
        finally:
            wakeups.close()
            sweeper.relay.close()

    def _pass(self, idle: float, errors: int, aliases: Sequence[str | None]) -> tuple[float, int]:
        """One pass over every database (one that fails does not stop the others); the
        pause before the next pass and the count of passes in a row that failed.
        """
        sweeper = self.sweeper
        more = False
        failed = False
        counts = {"published": 0, "failed": 0, "rescheduled": 0}
        try:
            now = sweeper.now()
            purge = self._purge_due()
        except StoreError:
            now = None  # the default database's clock: maintenance waits
            purge = False
        for alias in aliases:
            try:
                self._swept_at[alias] = sweeper.now(alias)
                report = sweeper.sweep(alias, path="relay")
                if purge:
                    sweeper.purge_expired(alias)
                    sweeper.purge_completed(alias)
            except StoreError:
                logger.exception("celery-outbox: could not sweep database %r; trying again", alias)
                failed = True
                continue
            more = more or report.more
            for name in counts:
                counts[name] += getattr(report, name)
        if purge and not failed:
            self._purged = now
        if any(counts.values()):
            logger.info("celery-outbox: swept %s", counts)
        if failed:
            pause = min(max(idle, 0.1) * 2**errors, MAX_ERROR_BACKOFF.total_seconds())
            return pause, errors + 1
        return (0.0 if more else idle), 0

    def _purge_due(self) -> bool:
        last = self._purged
        return last is None or self.sweeper.now() - last >= self.sweeper.config.sweep_interval

    def _until_due(self, pause: float, aliases: Sequence[str | None]) -> float:
        """``pause``, or less when a parked row comes due sooner: none at all when one
        came due since the database's last sweep began (that sweep found it not yet due,
        and it is not due after now either).
        """
        store = self.sweeper.store
        for alias in aliases:
            try:
                now = self.sweeper.now(alias)  # next_due is on the database's clock
                after = min(self._swept_at.get(alias, now), now)
                due = store.next_due(after=after, using=alias)
            except StoreError:  # the next pass reports it
                return pause
            if due is not None:
                pause = min(pause, max((due - now).total_seconds(), 0.0))
        return pause
