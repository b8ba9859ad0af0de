"""The backlog and the sweep record of :class:`celery_outbox.testing.InMemoryOutboxStore`."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping
from datetime import datetime, timedelta

from celery_outbox.monitoring import Backlog, LastSweep
from celery_outbox.records import DeadLetterStatus, MessageStatus, StoredDeadLetter, StoredMessage
from celery_outbox.storage import OutboxStore


class MemoryMonitoring(OutboxStore):
    """The monitoring reads of the in-memory store, on the store's clock.

    The sweep record is not transactional: like the real stores' it is written in a
    transaction of its own, whatever block the caller is in.
    """

    rows: dict[int, StoredMessage]
    letters: dict[int, StoredDeadLetter]
    clock: Callable[[], datetime]
    last_sweep_at: datetime | None
    _lock: threading.RLock

    def now(self, *, using: str | None = None) -> datetime:
        """The store's clock: the one clock of this "database"."""
        return self.clock()

    def backlog(self, *, using: str | None = None, bound: int | None = None) -> Backlog:
        with self._lock:
            now = self.clock()
            pending = [r for r in self.rows.values() if r.status is MessageStatus.PENDING]
            due = [r for r in pending if r.available_at <= now]
            waits = [now - _waiting_since(r) for r in due]
            return Backlog(
                due=len(due),
                parked=len(pending) - len(due),
                failed=sum(r.status is MessageStatus.FAILED for r in self.rows.values()),
                oldest_due_age=max(waits, default=None),
            )

    def next_due(self, *, after: datetime, using: str | None = None) -> datetime | None:
        with self._lock:
            pending = (r for r in self.rows.values() if r.status is MessageStatus.PENDING)
            return min((r.available_at for r in pending if r.available_at > after), default=None)

    def count_dead_letters(
        self, *, using: str | None = None, bound: int | None = None
    ) -> Mapping[DeadLetterStatus, int]:
        with self._lock:
            found = [letter.status for letter in self.letters.values()]
        return {status: found.count(status) for status in DeadLetterStatus}

    def keeps_sweeps(self) -> bool:
        """``True``: the store records the last sweep."""
        return True

    def record_sweep(self, *, every: timedelta, using: str | None = None) -> bool:
        with self._lock:
            now = self.clock()
            if self.last_sweep_at is not None and now - self.last_sweep_at < every:
                return False
            self.last_sweep_at = now
            return True

    def last_sweep(self, *, using: str | None = None) -> LastSweep | None:
        with self._lock:
            at, now = self.last_sweep_at, self.clock()
            return None if at is None else LastSweep(at=at, age=max(now - at, timedelta(0)))


def _waiting_since(row: StoredMessage) -> datetime:
    """When a due row started waiting: its due time, or its creation once a publish
    failed (:class:`~celery_outbox.monitoring.Backlog`)."""
    if row.attempts > 0 and row.created_at is not None:
        return row.created_at
    return row.available_at
