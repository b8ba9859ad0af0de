"""An in-memory :class:`~celery_outbox.storage.OutboxStore` for unit tests (shipped).

It keeps the contract of the real stores, including transactions: use
:meth:`InMemoryOutboxStore.atomic` as you would ``transaction.atomic`` (nested blocks
are savepoints). It is thread-safe but holds one transaction stack per thread.
"""

from __future__ import annotations

import copy
import itertools
import threading
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field, replace
from datetime import datetime

from celery_outbox.clock import Clock, utcnow
from celery_outbox.records import (
    Claim,
    DeadLetterStatus,
    MessageStatus,
    NewDeadLetter,
    NewMessage,
    StoredDeadLetter,
    StoredMessage,
)
from celery_outbox.storage import OutboxStore, PublishCallback, within_budget


@dataclass
class _Frame:
    """One open transaction or savepoint: what to restore, and what to run on commit."""

    rows: dict[int, StoredMessage]
    letters: dict[int, StoredDeadLetter]
    callbacks: list[Callable[[], object]] = field(default_factory=list)
    batch: list[StoredMessage] | None = None


class InMemoryOutboxStore(OutboxStore):
    """Outbox rows and dead letters in dictionaries, with transactions and savepoints."""

    def __init__(self, *, clock: Clock = utcnow) -> None:
        self.clock = clock
        self.rows: dict[int, StoredMessage] = {}
        self.letters: dict[int, StoredDeadLetter] = {}
        self.deliveries: dict[str, int] = {}
        self._ids = itertools.count(1)
        self._lock = threading.RLock()
        self._local = threading.local()

    # -- transactions ---------------------------------------------------------------
    @contextmanager
    def atomic(self) -> Iterator[None]:
        """A transaction (or, nested, a savepoint): rolled back if the block raises."""
        with self._lock:
            frame = _Frame(rows=copy.copy(self.rows), letters=copy.copy(self.letters))
        self._stack.append(frame)
        try:
            yield
        except BaseException:
            self._stack.pop()
            with self._lock:
                self.rows, self.letters = frame.rows, frame.letters
            raise
        self._stack.pop()
        if self._stack:
            self._stack[-1].callbacks.extend(frame.callbacks)
            return
        for callback in frame.callbacks:
            callback()

    @property
    def _stack(self) -> list[_Frame]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        stack: list[_Frame] = self._local.stack
        return stack

    def on_commit(self, callback: Callable[[], None], *, using: str | None = None) -> None:
        if self._stack:
            self._stack[-1].callbacks.append(callback)
        else:
            callback()

    def defer_publish(
        self, message: StoredMessage, publish: PublishCallback, *, using: str | None = None
    ) -> None:
        if not self._stack:
            publish([message])
            return
        outer = self._stack[0]
        if outer.batch is None:
            batch: list[StoredMessage] = []
            outer.batch = batch
            # Registered on the outermost frame, so a rolled-back savepoint cannot drop it;
            # rows of such a savepoint are gone, and still_leased()/claim() skip them.
            outer.callbacks.append(lambda: publish(batch))
        outer.batch.append(message)

    # -- dispatch ---------------------------------------------------------------------
    def add(self, message: NewMessage, *, using: str | None = None) -> int | None:
        with self._lock:
            if any(
                r.task_id == message.task_id and r.status is MessageStatus.PENDING
                for r in self.rows.values()
            ):
                return None
            row_id = next(self._ids)
            self.rows[row_id] = StoredMessage(
                **{f: getattr(message, f) for f in _NEW_MESSAGE_FIELDS},
                id=row_id,
                created_at=self.clock(),
            )
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
        max_attempts: int,
        using: str | None = None,
    ) -> int:
        with self._lock:
            held = self._held(claim, ids)
            for row in held:
                attempts = row.attempts + 1
                failed = retry_at is None or attempts >= max_attempts
                self.rows[row.id] = replace(
                    row,
                    attempts=attempts,
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

    # -- deliveries -----------------------------------------------------------------
    def record_delivery(self, task_id: str, *, now: datetime, using: str | None = None) -> int:
        with self._lock:
            self.deliveries[task_id] = self.deliveries.get(task_id, 1) + 1
            return self.deliveries[task_id]

    def forget_deliveries(self, task_id: str, *, using: str | None = None) -> None:
        with self._lock:
            self.deliveries.pop(task_id, None)

    # -- dead letters -------------------------------------------------------------------
    def add_dead_letter(self, letter: NewDeadLetter, *, using: str | None = None) -> int:
        with self._lock:
            letter_id = next(self._ids)
            self.letters[letter_id] = StoredDeadLetter(
                **{f: getattr(letter, f) for f in _NEW_LETTER_FIELDS}, id=letter_id
            )
            return letter_id

    def get_dead_letter(
        self, letter_id: int, *, using: str | None = None
    ) -> StoredDeadLetter | None:
        return self.letters.get(letter_id)

    def requeue_dead_letter(
        self,
        letter_id: int,
        message: NewMessage,
        *,
        by: str,
        now: datetime,
        using: str | None = None,
    ) -> tuple[str, int | None]:
        with self._lock:
            letter = self.letters.get(letter_id)
            if letter is None:
                raise LookupError(f"No dead letter with id {letter_id!r}.")
            if letter.status is not DeadLetterStatus.DEAD:
                return letter.requeued_task_id, None
            row_id = self.add(message, using=using)
            self.letters[letter_id] = replace(
                letter,
                status=DeadLetterStatus.REQUEUED,
                requeued_at=now,
                requeued_by=by,
                requeued_task_id=message.task_id,
            )
            return message.task_id, row_id

    def discard_dead_letter(self, letter_id: int, *, using: str | None = None) -> bool:
        with self._lock:
            letter = self.letters.get(letter_id)
            if letter is None or letter.status is not DeadLetterStatus.DEAD:
                return False
            self.letters[letter_id] = replace(letter, status=DeadLetterStatus.DISCARDED)
            return True


_NEW_MESSAGE_FIELDS = tuple(NewMessage.__dataclass_fields__)
_NEW_LETTER_FIELDS = tuple(NewDeadLetter.__dataclass_fields__)


def _claimable(row: StoredMessage, now: datetime) -> bool:
    return (
        row.status is MessageStatus.PENDING
        and row.available_at <= now
        and (row.locked_until is None or row.locked_until <= now)
    )
