"""``CompletedTask`` rows of :class:`celery_outbox.testing.InMemoryOutboxStore`."""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from datetime import datetime

from celery_outbox.completions import Completion
from celery_outbox.records import StoredCompletion
from celery_outbox.storage import OutboxStore


class MemoryCompletions(OutboxStore):
    """The atomic-task half of the in-memory store: a run holds its task id until it
    commits or rolls back, so a concurrent duplicate waits, as on a unique key."""

    completions: dict[str, StoredCompletion]
    _running: set[str]
    _released: threading.Condition
    #: The in-memory store's transaction (``InMemoryOutboxStore.atomic``).
    atomic: Callable[[], AbstractContextManager[None]]

    def atomic_problem(self, using: str | None = None) -> str | None:
        """``None``: the in-memory store runs atomic tasks."""
        return None

    @contextmanager
    def complete_once(
        self,
        task_id: str,
        task_name: str,
        *,
        now: datetime,
        using: str | None = None,
        root_id: str | None = None,
    ) -> Iterator[Completion]:
        with self._holding(task_id), self.atomic():
            previous = self.completions.get(task_id)
            completion = Completion(task_id, task_name, previous=previous)
            yield completion
            if previous is None:
                self.completions[task_id] = StoredCompletion(
                    task_id=task_id,
                    task_name=task_name,
                    completed_at=now,
                    result=completion.result,
                    root_id=root_id,
                )

    @contextmanager
    def _holding(self, task_id: str) -> Iterator[None]:
        with self._released:
            self._released.wait_for(lambda: task_id not in self._running)
            self._running.add(task_id)
        try:
            yield
        finally:
            with self._released:
                self._running.discard(task_id)
                self._released.notify_all()

    def completion(self, task_id: str, *, using: str | None = None) -> StoredCompletion | None:
        return self.completions.get(task_id)

    def count_completed(self, *, using: str | None = None) -> int:
        return len(self.completions)

    def purge_completed(self, *, older_than: datetime, limit: int, using: str | None = None) -> int:
        with self._released:
            doomed = [
                key for key, row in self.completions.items() if row.completed_at < older_than
            ][:limit]
            for key in doomed:
                del self.completions[key]
            return len(doomed)
