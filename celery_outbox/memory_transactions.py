"""Transactions and savepoints over in-memory state, for :mod:`celery_outbox.testing`.

Each thread has its own stack of open frames. A frame keeps a snapshot of the state to
restore when its block raises, the callbacks to run once the outermost frame commits
(a committed savepoint hands them to its parent, a rolled-back one drops them), and the
outermost frame keeps the on-commit publish batches, one per
:func:`~celery_outbox.storage.publisher_key`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Hashable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any

from celery_outbox.records import StoredMessage
from celery_outbox.storage import PublishCallback, publisher_key


@dataclass(eq=False)  # a frame is its own identity (transaction tokens)
class _Frame:
    """One open transaction or savepoint: what to restore, and what to run on commit."""

    snapshot: Any
    callbacks: list[Callable[[], object]] = field(default_factory=list)
    #: The outermost frame's on-commit batches, by publisher key.
    batches: dict[Hashable, list[StoredMessage]] = field(default_factory=dict)


class MemoryTransactions:
    """Per-thread transaction stacks over state that ``snapshot`` copies and ``restore``
    puts back (both called under ``lock``)."""

    def __init__(
        self,
        *,
        snapshot: Callable[[], Any],
        restore: Callable[[Any], None],
        lock: AbstractContextManager[Any],
    ) -> None:
        self._snapshot, self._restore, self._lock = snapshot, restore, lock
        self._local = threading.local()

    @contextmanager
    def atomic(self) -> Iterator[None]:
        """A transaction (or, nested, a savepoint): rolled back if the block raises."""
        with self._lock:
            frame = _Frame(snapshot=self._snapshot())
        stack = self._stack
        stack.append(frame)
        try:
            yield
        except BaseException:
            stack.pop()
            with self._lock:
                self._restore(frame.snapshot)
            raise
        stack.pop()
        if stack:
            stack[-1].callbacks.extend(frame.callbacks)
            return
        for callback in frame.callbacks:
            callback()

    def on_commit(self, callback: Callable[[], None]) -> None:
        """Run ``callback`` after the outermost commit (at once outside a transaction)."""
        if self._stack:
            self._stack[-1].callbacks.append(callback)
        else:
            callback()

    def token(self) -> Hashable | None:
        """This thread's innermost open frame (``None``: no transaction)."""
        stack = self._stack
        return stack[-1] if stack else None

    def awaits(self, callback: Callable[[], None]) -> bool:
        """Whether ``callback`` waits in one of this thread's open frames."""
        return any(callback in frame.callbacks for frame in self._stack)

    def defer_publish(self, message: StoredMessage, publish: PublishCallback) -> None:
        """Add ``message`` to ``publish``'s batch of the outermost transaction."""
        if not self._stack:
            publish((message,))
            return
        outer, key = self._stack[0], publisher_key(publish)
        batch = outer.batches.get(key)
        if batch is None:
            batch = outer.batches[key] = []
            rows = batch
            # Registered on the outermost frame, so a rolled-back savepoint cannot drop it;
            # rows of such a savepoint are gone, and still_leased()/claim() skip them.
            outer.callbacks.append(lambda: publish(tuple(rows)))
        batch.append(message)

    @property
    def _stack(self) -> list[_Frame]:
        if not hasattr(self._local, "stack"):
            self._local.stack = []
        stack: list[_Frame] = self._local.stack
        return stack
