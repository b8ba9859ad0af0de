"""An in-memory :class:`~celery_outbox.storage.OutboxStore` for unit tests (shipped).

It keeps the contract of the real stores, including transactions: use
:meth:`InMemoryOutboxStore.atomic` as you would ``transaction.atomic`` (nested blocks
are savepoints). It is thread-safe but holds one transaction stack per thread.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from contextlib import AbstractContextManager
from dataclasses import replace
from datetime import datetime
from typing import Any

from celery_outbox.clock import Clock, utcnow
from celery_outbox.memory_completions import MemoryCompletions
from celery_outbox.memory_letters import MemoryDeadLetters
from celery_outbox.memory_monitoring import MemoryMonitoring
from celery_outbox.memory_transactions import MemoryTransactions
from celery_outbox.memory_workflows import MemoryJoin, MemoryWorkflows
from celery_outbox.records import (
    CancelledRow,
    Claim,
    MessageStatus,
    NewMessage,
    StoredCompletion,
    StoredDeadLetter,
    StoredMessage,
    cancelled_row,
)
from celery_outbox.rows import message_columns, stored_message
from celery_outbox.storage import PublishCallback, Supersedes, within_budget
from celery_outbox.workflows import StoredWorkflow

#: The state a transaction's rollback restores (the delivery counts are not transactional).
_TRANSACTIONAL = ("rows", "letters", "completions", "workflows", "joins")


class InMemoryOutboxStore(MemoryCompletions, MemoryDeadLetters, MemoryWorkflows, MemoryMonitoring):
    """Outbox rows, dead letters, completed atomic tasks, workflows, chord joins and the
    last sweep in dictionaries, with transactions and savepoints."""

    def __init__(self, *, clock: Clock = utcnow) -> None:
        self.clock = clock
        self.rows: dict[int, StoredMessage] = {}
        self.letters: dict[int, StoredDeadLetter] = {}
        self.deliveries: dict[str, int] = {}
        self.completions: dict[str, StoredCompletion] = {}
        self.workflows: dict[str, StoredWorkflow] = {}
        self.joins: dict[str, MemoryJoin] = {}
        self.last_sweep_at: datetime | None = None
        self._running: set[str] = set()
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._released = threading.Condition(self._lock)
        self._transactions = MemoryTransactions(
            snapshot=lambda: {name: copy.copy(getattr(self, name)) for name in _TRANSACTIONAL},
            restore=self._restore,
            lock=self._lock,
        )

    # -- transactions ---------------------------------------------------------------
    def atomic(self) -> AbstractContextManager[None]:
        """A transaction (or, nested, a savepoint): rolled back if the block raises."""
        return self._transactions.atomic()

    def _restore(self, snapshot: dict[str, Any]) -> None:
        for name, state in snapshot.items():
            setattr(self, name, state)

    def on_commit(self, callback: Callable[[], None], *, using: str | None = None) -> None:
        self._transactions.on_commit(callback)

    def awaits_commit(self, callback: Callable[[], None], *, using: str | None = None) -> bool:
        return self._transactions.awaits(callback)

    def transaction_token(self, *, using: str | None = None) -> Hashable | None:
        return self._transactions.token()  # the innermost frame: add_many loops over add

    def defer_publish(
        self, message: StoredMessage, publish: PublishCallback, *, using: str | None = None
    ) -> None:
        self._transactions.defer_publish(message, publish)

    # -- dispatch ---------------------------------------------------------------------
    def add(
        self,
        message: NewMessage,
        *,
        using: str | None = None,
        supersedes: Supersedes | None = None,
    ) -> int | None:
        with self._lock:
            pending = next(
                (
                    r
                    for r in self.rows.values()
                    if r.task_id == message.task_id and r.status is MessageStatus.PENDING
                ),
                None,
            )
            if pending is not None:
                if supersedes is None or not supersedes(pending):
                    return None
                del self.rows[pending.id]
            row_id = next(self._ids)
            columns = message_columns(message, created_at=self.clock())
            self.rows[row_id] = stored_message({**columns, "id": row_id})
            return row_id

    # -- publishing and sweeping ----------------------------------------------------------
    def claim(
        self,
        ids: Iterable[int],
        *,
        now: datetime,
        lease_until: datetime,
        max_bytes: int | None = None,
        using: str | None = None,
    ) -> Claim:
        wanted = set(ids)
        return self._claim(
            lambda r: r.id in wanted,
            now=now,
            limit=None,
            lease_until=lease_until,
            max_bytes=max_bytes,
        )

    def claim_due(
        self,
        *,
        now: datetime,
        created_before: datetime,
        limit: int,
        lease_until: datetime,
        max_bytes: int | None = None,
        using: str | None = None,
    ) -> Claim:
        return self._claim(
            lambda r: (
                r.created_at is not None
                and (r.created_at <= created_before or r.available_at > r.created_at)
            ),
            now=now,
            limit=limit,
            lease_until=lease_until,
            max_bytes=max_bytes,
        )

    def _claim(
        self,
        keep: Callable[[StoredMessage], bool],
        *,
        now: datetime,
        limit: int | None,
        lease_until: datetime,
        max_bytes: int | None,
    ) -> Claim:
        with self._lock:
            due = sorted(
                (r for r in self.rows.values() if _claimable(r, now) and keep(r)),
                key=lambda r: (r.available_at, r.id),
            )[:limit]
            due = due[: within_budget((len(r.payload) for r in due), max_bytes)]
            claimed = tuple(replace(r, locked_until=lease_until) for r in due)
            self.rows.update((r.id, r) for r in claimed)
            return Claim(messages=claimed, lease_until=lease_until)

    def mark_published(
        self,
        claim: Claim,
        ids: Sequence[int],
        *,
        now: datetime,
        keep: bool,
        using: str | None = None,
    ) -> int:
        with self._lock:
            held = self._held(claim, ids)
            for row in held:
                if keep:
                    self.rows[row.id] = replace(
                        row, status=MessageStatus.PUBLISHED, published_at=now, locked_until=None
                    )
                else:
                    del self.rows[row.id]
            return len(held)

    def record_failure(
        self,
        claim: Claim,
        ids: Sequence[int],
        *,
        error: str,
        retry_at: datetime | None,
        using: str | None = None,
    ) -> int:
        with self._lock:
            held = self._held(claim, ids)
            for row in held:
                failed = retry_at is None
                self.rows[row.id] = replace(
                    row,
                    attempts=row.attempts + 1,
                    last_error=error,
                    locked_until=None,
                    status=MessageStatus.FAILED if failed else MessageStatus.PENDING,
                    available_at=row.available_at if failed or retry_at is None else retry_at,
                )
            return len(held)

    def still_leased(
        self, messages: Sequence[StoredMessage], *, using: str | None = None
    ) -> set[int]:
        with self._lock:
            return {
                m.id
                for m in messages
                if (row := self.rows.get(m.id)) is not None
                and row.status is MessageStatus.PENDING
                and row.locked_until is not None
                and row.locked_until == m.locked_until
            }

    def _held(self, claim: Claim, ids: Iterable[int]) -> list[StoredMessage]:
        rows = (self.rows.get(i) for i in ids)
        leases = claim.leases
        return [
            r
            for r in rows
            if r is not None and r.locked_until in leases and r.status is MessageStatus.PENDING
        ]

    def cancel_pending(
        self,
        *,
        ids: Sequence[int] = (),
        task_ids: Sequence[str] = (),
        now: datetime,
        using: str | None = None,
    ) -> list[CancelledRow]:
        wanted_ids, wanted_tasks = set(ids), set(task_ids)
        with self._lock, self.atomic():
            found = [
                row
                for row in sorted(self.rows.values(), key=lambda r: r.id)
                if row.status is MessageStatus.PENDING
                and (row.id in wanted_ids or row.task_id in wanted_tasks)
            ]
            cancelled = [
                cancelled_row(
                    r.id, r.task_id, r.task_name, r.options, leased=r.locked_until is not None
                )
                for r in found
            ]
            for row in found:
                del self.rows[row.id]
            for root in dict.fromkeys(c.root_id for c in cancelled):
                self.workflow_cancelled(root, now=now)
        return cancelled

    def reset(self, ids: Iterable[int], *, now: datetime, using: str | None = None) -> int:
        changed = 0
        with self._lock:
            for row in [self.rows[i] for i in ids if i in self.rows]:
                if row.status is MessageStatus.PUBLISHED or self._other_pending(row):
                    continue
                attempts = 0 if row.status is MessageStatus.FAILED else row.attempts
                self.rows[row.id] = replace(
                    row,
                    status=MessageStatus.PENDING,
                    available_at=now,
                    locked_until=None,
                    attempts=attempts,
                )
                changed += 1
        return changed

    def _other_pending(self, row: StoredMessage) -> bool:
        return any(
            r.task_id == row.task_id and r.id != row.id and r.status is MessageStatus.PENDING
            for r in self.rows.values()
        )

    def count_by_status(self, *, using: str | None = None) -> Mapping[MessageStatus, int]:
        with self._lock:
            return {s: sum(r.status is s for r in self.rows.values()) for s in MessageStatus}

    def oldest_pending(self, *, using: str | None = None) -> datetime | None:
        with self._lock:
            return min(
                (
                    r.created_at
                    for r in self.rows.values()
                    if r.status is MessageStatus.PENDING and r.created_at
                ),
                default=None,
            )

    def purge(
        self,
        *,
        statuses: Iterable[MessageStatus],
        older_than: datetime,
        limit: int,
        using: str | None = None,
    ) -> int:
        wanted = set(statuses)
        with self._lock:
            doomed = [
                r.id
                for r in self.rows.values()
                if r.status in wanted and r.created_at is not None and r.created_at < older_than
            ][:limit]
            for row_id in doomed:
                del self.rows[row_id]
            return len(doomed)


def _claimable(row: StoredMessage, now: datetime) -> bool:
    return (
        row.status is MessageStatus.PENDING
        and row.available_at <= now
        and (row.locked_until is None or row.locked_until <= now)
    )
