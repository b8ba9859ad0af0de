"""Dead letters and delivery counts of :class:`celery_outbox.testing.InMemoryOutboxStore`."""

from __future__ import annotations

import itertools
import threading
from dataclasses import replace
from datetime import datetime

from celery_outbox.records import DeadLetterStatus, NewDeadLetter, NewMessage, StoredDeadLetter
from celery_outbox.rows import letter_columns, stored_letter
from celery_outbox.storage import OutboxStore


class MemoryDeadLetters(OutboxStore):
    """The dead-letter and delivery half of the in-memory store (its rows are the other)."""

    letters: dict[int, StoredDeadLetter]
    deliveries: dict[str, int]
    _ids: itertools.count[int]
    _lock: threading.RLock

    # -- deliveries -----------------------------------------------------------------
    def record_delivery(self, task_id: str, *, now: datetime, using: str | None = None) -> int:
        with self._lock:
            self.deliveries[task_id] = self.deliveries.get(task_id, 1) + 1
            return self.deliveries[task_id]

    def forget_deliveries(self, task_id: str, *, using: str | None = None) -> None:
        with self._lock:
            self.deliveries.pop(task_id, None)

    # -- dead letters -------------------------------------------------------------------
    def add_dead_letter(
        self, letter: NewDeadLetter, *, using: str | None = None, workflow: str | None = None
    ) -> int:
        with self._lock:
            letter_id = next(self._ids)
            self.letters[letter_id] = stored_letter({**letter_columns(letter), "id": letter_id})
            if workflow is not None:
                self.workflow_failed(workflow, letter.task_id, now=letter.failed_at)
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
        workflow: str | None = None,
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
            if workflow is not None:
                self.workflow_resumed(workflow)
            return message.task_id, row_id

    def discard_dead_letter(self, letter_id: int, *, using: str | None = None) -> bool:
        with self._lock:
            letter = self.letters.get(letter_id)
            if letter is None or letter.status is not DeadLetterStatus.DEAD:
                return False
            self.letters[letter_id] = replace(letter, status=DeadLetterStatus.DISCARDED)
            return True

    def complete_dead_letters(self, task_id: str, *, using: str | None = None) -> int:
        with self._lock:
            found = [
                letter
                for letter in self.letters.values()
                if letter.task_id == task_id and letter.status is DeadLetterStatus.DEAD
            ]
            for letter in found:
                self.letters[letter.id] = replace(letter, status=DeadLetterStatus.COMPLETED)
            return len(found)
