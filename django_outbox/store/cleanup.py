"""Removing the rows the on-commit publisher published, off the caller's thread.

After COMMIT the on-commit publisher publishes a transaction's rows and then removes
them (or marks them ``published``). The publish is what the caller waits for; the
removal is bookkeeping, and a thread of this process does it right after, so the
request does not wait for that statement's round trip.

Nothing a crash can do gets worse. Every row is committed before any of this starts,
so none is lost. A published row not yet removed is still ``pending`` under the lease it
was born (or claimed) with, which no sweeper takes before it runs out
(``outbox_publish_grace``): a crash between the publish and the removal makes the
sweeper publish it again, exactly as a crash between the publish and the ``DELETE``
did on the caller's thread. Each row is published before it is handed here, so the
window is that round trip plus the hand-off; the thread removes whatever waits at once,
in one statement per database (removals that waited together are merged, each row still
fenced by its own lease), and when more than :data:`MAX_WAITING` removals wait (the
database is slow) the caller removes its rows itself. In normal operation nothing is
published twice: the process waits for the removals when it exits (``atexit``, and
Celery's ``worker_process_shutdown`` in a worker's child, which skips ``atexit``).

The thread has its own database connection per alias (Django's are per thread), closed
after :data:`IDLE_CLOSE` seconds without work. A failed removal is retried once on a
fresh connection, then logged: the rows stay leased, and the sweeper publishes them
again once their lease runs out, as when the caller's ``DELETE`` failed.
"""

from __future__ import annotations

import atexit
import logging
import os
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from celery.signals import worker_process_shutdown
from django.db import connections

from celery_outbox.exceptions import StoreError
from celery_outbox.records import Claim, StoredMessage
from django_outbox.store.calls import refresh_connection

logger = logging.getLogger(__name__)

#: Removals waiting beyond which the caller removes its rows itself.
MAX_WAITING = 1000
#: Seconds without work after which the thread closes its database connections.
IDLE_CLOSE = 1.0
#: Seconds the process waits at exit for the removals still waiting.
EXIT_WAIT = 5.0

#: Runs one removal: the store's ``(claim, ids, now=, keep=, alias=)`` statement.
Mark = Callable[..., object]


@dataclass(frozen=True, kw_only=True)
class Removal:
    """Published rows to remove: the ``ids`` of ``claim``, on database ``alias``."""

    claim: Claim
    ids: tuple[int, ...]
    now: datetime
    keep: bool
    alias: str
    mark: Mark


class Cleanup:
    """One thread running removals, those that waited together in one statement each."""

    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._waiting: list[Removal] = []
        self._busy = 0
        self._closing = False
        self._thread: threading.Thread | None = None

    def submit(self, removal: Removal) -> bool:
        """Run ``removal`` soon on the thread; ``False`` when too many wait (the caller
        runs it itself)."""
        with self._lock:
            if len(self._waiting) >= MAX_WAITING:
                return False
            self._waiting.append(removal)
            if self._thread is None:
                self._thread = threading.Thread(
                    target=self._run, name="django-outbox-cleanup", daemon=True
                )
                self._thread.start()
            self._lock.notify()
        return True

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every removal submitted so far has run; whether they all did
        within ``timeout`` seconds."""
        with self._lock:
            return self._lock.wait_for(lambda: not self._waiting and not self._busy, timeout)

    def close(self, timeout: float | None = None) -> bool:
        """Wait for the removals submitted so far, then have the thread close its
        database connections (it opens them again when needed); whether it did within
        ``timeout`` seconds."""
        with self._lock:
            if self._thread is None:
                return True
            self._closing = True
            self._lock.notify_all()
            return self._lock.wait_for(lambda: not self._closing, timeout)

    def _run(self) -> None:
        used: set[str] = set()
        while True:
            with self._lock:
                wait = IDLE_CLOSE if used else None
                if not self._lock.wait_for(lambda: self._waiting or self._closing, wait):
                    _close(used)
                    continue
                if self._closing and not self._waiting:
                    _close(used)
                    self._closing = False
                    self._lock.notify_all()
                    continue
                work, self._waiting, self._busy = self._waiting, [], len(self._waiting)
            for removal in merged(work):
                used.add(removal.alias)
                _remove(removal)
            with self._lock:
                self._busy = 0
                self._lock.notify_all()


def merged(removals: Sequence[Removal]) -> list[Removal]:
    """One removal per database, ``keep`` and store, for all of ``removals``: each row
    still fenced by its own lease (the claims' messages carry them)."""
    groups: dict[tuple[str, bool, Mark], list[Removal]] = {}
    for removal in removals:
        groups.setdefault((removal.alias, removal.keep, removal.mark), []).append(removal)
    return [_merge(group) if len(group) > 1 else group[0] for group in groups.values()]


def _merge(group: list[Removal]) -> Removal:
    messages: list[StoredMessage] = []
    for removal in group:
        wanted = set(removal.ids)
        messages.extend(m for m in removal.claim.messages if m.id in wanted)
    claim = Claim(messages=tuple(messages), lease_until=max(r.claim.lease_until for r in group))
    first = group[0]
    return Removal(
        claim=claim,
        ids=tuple(m.id for m in messages),
        now=max(r.now for r in group),
        keep=first.keep,
        alias=first.alias,
        mark=first.mark,
    )


def _remove(removal: Removal) -> None:
    def run() -> None:
        removal.mark(
            removal.claim, removal.ids, now=removal.now, keep=removal.keep, alias=removal.alias
        )

    try:
        refresh_connection(removal.alias)
        try:
            run()
        except StoreError:  # a connection gone stale while idle: once more on a fresh one
            connections[removal.alias].close()
            run()
    except Exception:  # logged: the thread serves every later commit
        logger.exception(
            "celery-outbox: removing %d published row(s) failed; the sweeper will publish "
            "them again once their lease runs out",
            len(removal.ids),
        )


def _close(aliases: set[str]) -> None:
    for alias in aliases:
        connections[alias].close()
    aliases.clear()


_cleanup = Cleanup()


def submit(removal: Removal) -> bool:
    """Run ``removal`` soon, off this thread; ``False`` when the caller must run it itself."""
    return _cleanup.submit(removal)


def flush(timeout: float | None = None) -> bool:
    """Wait until the removals submitted so far in this process have run (tests, exit);
    whether they did within ``timeout`` seconds."""
    return _cleanup.flush(timeout)


def close(timeout: float | None = None) -> bool:
    """Wait until the removals submitted so far have run, and close the thread's database
    connections (exit, and tests about to drop their database); whether it happened
    within ``timeout`` seconds."""
    return _cleanup.close(timeout)


def _after_fork() -> None:
    # The parent's thread and removals stay the parent's: the child starts empty.
    global _cleanup
    _cleanup = Cleanup()


def _at_exit(*_: Any, **__: Any) -> None:
    if not close(EXIT_WAIT):
        logger.warning(
            "celery-outbox: published rows still being removed at exit; the sweeper will "
            "publish them again"
        )


os.register_at_fork(after_in_child=_after_fork)
atexit.register(_at_exit)
worker_process_shutdown.connect(_at_exit, weak=False)
