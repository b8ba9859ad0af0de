"""Deleting published rows off the publisher's path (PostgreSQL, both stores).

After a commit that wrote outbox rows (a Django request's transaction, an atomic step
handing on its successors), the rows are published and must then go. That fenced
``DELETE`` was a statement of its own, on the caller's path, per commit. Inside
:func:`deferring` (the on-commit publish of the Django store, the commit of an atomic
run of the SQLAlchemy store) it is handed to a thread of the process instead, which waits
:data:`FLUSH_AFTER` for the rows of the next commits and deletes them all with one
statement, as the sweeper does a batch.

Nothing else changes: until then the rows are published and still hold the lease they
were born with (at least a second, ``outbox_claim_lease``), so no sweeper publishes them
again, and the ``DELETE`` is fenced by that lease as before. A process killed before the
thread ran leaves them to the sweeper once their lease ends, as a kill between the publish
and the ``DELETE`` always did. A process that exits deletes what is left first
(``atexit``, and Celery's ``worker_process_shutdown`` for prefork children, which leave
without running ``atexit``).

A store whose thread holds a connection of its own (Django's connections belong to their
thread) passes ``release``: the thread calls it after :data:`IDLE_AFTER` seconds without
rows, so an idle process holds no extra connection. :meth:`PublishedRows.settle` deletes
what waits and releases at once (a test suite's end, before its database is dropped).
"""

from __future__ import annotations

import atexit
import os
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from datetime import datetime

from celery.signals import worker_process_shutdown

from celery_outbox.long_text import bounded_logger
from celery_outbox.store.records import Claim

logger = bounded_logger(__name__)

#: Seconds the thread waits after the first row before deleting (the rows of the steps
#: that commit meanwhile go in the same statement).
FLUSH_AFTER = 0.05

#: Seconds without rows after which the thread calls ``release``.
IDLE_AFTER = 0.5

#: Deletes ``(ids, leases)`` fenced by the leases: the store's statement.
Delete = Callable[[Sequence[int], Sequence[datetime]], object]

_deferring: ContextVar[bool] = ContextVar("celery_outbox_deferring_deletes", default=False)


@contextmanager
def deferring() -> Iterator[None]:
    """Within the block, :meth:`PublishedRows.defer` takes the published rows' deletes."""
    token = _deferring.set(True)
    try:
        yield
    finally:
        _deferring.reset(token)


class PublishedRows:
    """The published rows of one store waiting for their ``DELETE``, and the thread that
    runs it (started in the process that defers the first row, again after a fork).
    """

    def __init__(
        self,
        delete: Delete,
        *,
        flush_after: float = FLUSH_AFTER,
        release: Callable[[], object] | None = None,
        idle_after: float = IDLE_AFTER,
    ) -> None:
        self._delete = delete
        self._flush_after = flush_after
        self._release = release
        self._idle_after = idle_after
        self._rows: dict[int, datetime] = {}
        self._deleting: dict[int, datetime] = {}  # the rows of the DELETE running now
        self._tasks: dict[int, str] = {}  # the task id of each row waiting or deleting
        self._ready = threading.Condition()
        self._pid: int | None = None
        self._settling: list[threading.Event] = []

    def took(self, claim: Claim, ids: Sequence[int], *, dialect: str) -> bool:
        """Whether the deletes of the published rows ``ids`` of ``claim`` were deferred:
        inside :func:`deferring`, on PostgreSQL (SQLite's writers lock each other out).
        """
        if not _deferring.get() or dialect != "postgresql":
            return False
        self.defer(
            ids,
            {m.id: m.locked_until or claim.lease_until for m in claim.messages},
            tasks={m.id: m.task_id for m in claim.messages},
        )
        return True

    def defer(
        self,
        ids: Sequence[int],
        leases: dict[int, datetime],
        *,
        tasks: dict[int, str] | None = None,
    ) -> None:
        """Delete the rows ``ids`` (each fenced by its lease in ``leases``; ``tasks``: their
        task ids, for :meth:`waits_for`) soon.
        """
        self._start_here()
        with self._ready:
            for row_id in ids:
                self._rows[row_id] = leases[row_id]
                if tasks is not None:
                    self._tasks[row_id] = tasks[row_id]
            self._ready.notify()

    def waits_for(self, task_id: str) -> bool:
        """Whether a row of ``task_id`` is among the rows waiting for (or in) the ``DELETE``."""
        with self._ready:
            return task_id in self._tasks.values()

    def holds(self, row_id: int, lease: datetime | None) -> bool:
        """Whether row ``row_id``, under ``lease``, is a published row of this process
        waiting for (or in) its ``DELETE``: its message was sent, so a dispatch of its task
        id is a new call, not one the row will deliver.
        """
        with self._ready:
            return lease is not None and lease in (
                self._rows.get(row_id),
                self._deleting.get(row_id),
            )

    def flush(self) -> None:
        """Delete every row waiting now, on the calling thread. Never raises (logged)."""
        with self._ready:
            rows = self._rows
            self._rows = {}
            self._deleting = rows
        if not rows:
            return
        try:
            self._delete(list(rows), sorted(set(rows.values())))
        except Exception:  # the rows stay leased: the sweeper publishes them again
            logger.warning(
                "celery-outbox: %d published row(s) could not be deleted; the sweeper "
                "publishes them again once their lease ends",
                len(rows),
                exc_info=True,
            )
        finally:
            with self._ready:
                self._deleting = {}
                for row_id in rows:
                    self._tasks.pop(row_id, None)

    def _start_here(self) -> None:
        # Unlocked: two threads starting at once start two flushers, which is harmless.
        pid = os.getpid()
        if self._pid == pid:
            return
        if self._pid is not None:  # forked: the parent's rows are the parent's to delete
            self._rows = {}
            self._deleting = {}
            self._tasks = {}
            self._ready = threading.Condition()
        self._pid = pid
        threading.Thread(target=self._run, name="celery-outbox-deletes", daemon=True).start()
        atexit.register(self.flush)
        worker_process_shutdown.connect(self._on_shutdown, weak=False)

    def _on_shutdown(self, **_: object) -> None:
        self.flush()

    def settle(self, timeout: float = 5.0) -> bool:
        """Delete every row waiting now and let the thread release its connection;
        whether it did within ``timeout`` seconds (at once when no thread runs here).
        """
        if self._pid != os.getpid():
            self.flush()
            return True
        done = threading.Event()
        with self._ready:
            self._settling.append(done)
            self._ready.notify()
        return done.wait(timeout)

    def _run(self) -> None:
        holding = False  # whether a flush ran since the last release
        while True:
            with self._ready:
                while not self._rows and not self._settling:
                    wait = self._idle_after if holding and self._release else None
                    if not self._ready.wait(wait):
                        break  # idle: release below
                settling = self._settling
                self._settling = []
                waiting = bool(self._rows)
            if waiting and not settling:
                time.sleep(self._flush_after)
                self.flush()
                holding = True
                continue
            self.flush()
            if holding or settling:
                self._released()
                holding = False
            for done in settling:
                done.set()

    def _released(self) -> None:
        if self._release is None:
            return
        try:
            self._release()
        except Exception:  # a connection that fails to close is gone anyway
            logger.debug("celery-outbox: releasing the deletes' connection failed", exc_info=True)
