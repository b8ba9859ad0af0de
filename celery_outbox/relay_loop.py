"""The relay loop (``outbox relay``, ``Sweeper.run``): sweep, then wait for a reason to sweep.

A pass sweeps every alias; maintenance (purging published rows past
``outbox_keep_published``, completed atomic tasks and chord joins past
``outbox_keep_completed``) runs at most once per ``outbox_sweep_interval``, so a pass
woken for one new row pays its claim and publish, not two ``DELETE`` statements. After a
pass that left nothing due, the loop waits until the first of: a PostgreSQL ``NOTIFY``
(:class:`~celery_outbox.listener.Wakeups`), the next parked row's due time
(``store.next_due``), ``poll`` seconds. A store error is logged and the loop pauses,
doubling from ``poll`` up to :data:`MAX_ERROR_BACKOFF`.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import datetime, timedelta
from typing import Any, Protocol

from celery_outbox.config import OutboxConfig
from celery_outbox.exceptions import StoreError
from celery_outbox.listener import Wakeups, listen_connectors
from celery_outbox.long_text import bounded_logger
from celery_outbox.relay import Relay
from celery_outbox.storage import OutboxStore

logger = bounded_logger(__name__)

#: Longest pause of the loop after a store error (it doubles from ``poll``).
MAX_ERROR_BACKOFF = timedelta(seconds=30)


class Sweeps(Protocol):
    """What the loop needs of a :class:`~celery_outbox.sweeper.Sweeper`."""

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
        self.sweeper, self.listen = sweeper, listen
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
        the broker and LISTEN connections are released when it ends."""
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
        pause before the next pass and the count of passes in a row that failed."""
        sweeper = self.sweeper
        more, failed = False, False
        counts = {"published": 0, "failed": 0, "rescheduled": 0}
        try:
            now, purge = sweeper.now(), self._purge_due()
        except StoreError:
            now, purge = None, False  # the default database's clock: maintenance waits
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
        and it is not due after now either)."""
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
