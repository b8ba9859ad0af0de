"""One on-commit publish per transaction, however many rows it wrote.

Each database connection keeps one :class:`CommitBatch` per publisher, keyed by
:func:`celery_outbox.storage.publisher_key` as in every store. The first row a
transaction defers registers the batch's ``on_commit`` callback; later rows join it, so
the commit runs one ``publish(messages)`` for all of them.

Django forgets a callback when the transaction, or the savepoint it was registered in,
rolls back. A batch whose callback is gone must not collect later rows (they would never
be published on commit), so before joining a batch we check that its callback is still
among the connection's on-commit callbacks, and start a new batch when it is not.

A batch whose rows are all known committed (:mod:`~django_outbox.store.commits`) says so
while its callback runs, and the store skips reading them back.
"""

from __future__ import annotations

from collections.abc import Hashable
from typing import Any

from django.db import transaction

from celery_outbox import published_rows
from celery_outbox.records import StoredMessage
from celery_outbox.storage import PublishCallback, publisher_key
from django_outbox._compat import on_commit_callbacks
from django_outbox.store import commits

#: Attribute of a Django connection holding its batches, keyed by publisher.
_BATCHES_ATTR = "_django_outbox_batches"


class CommitBatch:
    """The rows one transaction deferred for one publisher; called once on commit."""

    def __init__(self, publish: PublishCallback, *, connection: Any, alias: str) -> None:
        self.publish, self.alias = publish, alias
        self.messages: list[StoredMessage] = []
        #: The one callable registered with ``on_commit`` (kept: identity marks it).
        self.callback = self.publish_all
        #: The connection's doubts, and their count before the first row was written.
        self.doubts = commits.watch(connection)
        self.mark = self.doubts.count

    def publish_all(self) -> None:
        """Publish every row of the batch; all of them known committed when nothing that
        could have taken one away happened since the batch began."""
        messages = tuple(self.messages)
        known = frozenset(m.id for m in messages) if self.doubts.count == self.mark else None
        with published_rows.deferring():  # their DELETE leaves the caller's path
            if known is None:
                self.publish(messages)
                return
            with commits.known_committed(self.alias, known):
                self.publish(messages)

    def is_registered(self, connection: Any) -> bool:
        """Whether Django will still call this batch when ``connection`` commits."""
        return any(callback is self.callback for callback in on_commit_callbacks(connection))


def defer(message: StoredMessage, publish: PublishCallback, *, using: str) -> None:
    """Publish ``message`` with ``publish`` right after the current commit of ``using``.

    Outside an atomic block ``publish([message])`` runs at once.
    """
    connection = transaction.get_connection(using)
    if not connection.in_atomic_block:
        with published_rows.deferring():
            publish((message,))
        return
    batches: dict[Hashable, CommitBatch] = getattr(connection, _BATCHES_ATTR, None) or {}
    key = publisher_key(publish)
    batch = batches.get(key)
    if batch is None or not batch.is_registered(connection):
        batch = _new_batch(connection, batches, key, publish, using=using)
    batch.messages.append(message)


def _new_batch(
    connection: Any,
    batches: dict[Hashable, CommitBatch],
    key: Hashable,
    publish: PublishCallback,
    *,
    using: str,
) -> CommitBatch:
    # Drop batches Django already ran or discarded, so the dict never grows.
    live = {k: b for k, b in batches.items() if b.is_registered(connection)}
    batch = live[key] = CommitBatch(publish, connection=connection, alias=using)
    setattr(connection, _BATCHES_ATTR, live)
    # robust: a failing publisher never stops the caller's other on-commit callbacks.
    transaction.on_commit(batch.callback, using=using, robust=True)
    return batch
