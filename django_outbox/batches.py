"""One on-commit publish per transaction, however many rows it wrote.

Each database connection keeps one :class:`CommitBatch` per publisher. The first row a
transaction defers registers the batch's ``on_commit`` callback; later rows join it, so
the commit runs one ``publish(messages)`` for all of them.

Django forgets a callback when the transaction, or the savepoint it was registered in,
rolls back. A batch whose callback is gone must not collect later rows (they would never
be published on commit), so before joining a batch we check that its callback is still
in ``connection.run_on_commit``, and start a new batch when it is not.
"""

from __future__ import annotations

import functools
from collections.abc import Hashable
from typing import Any

from django.db import transaction

from celery_outbox.records import StoredMessage
from celery_outbox.storage import PublishCallback

#: Attribute of a Django connection holding its batches, keyed by publisher.
_BATCHES_ATTR = "_django_outbox_batches"


class CommitBatch:
    """The rows one transaction deferred for one publisher; called once on commit."""

    def __init__(self, publish: PublishCallback) -> None:
        self.publish = publish
        self.messages: list[StoredMessage] = []
        #: The one callable registered with ``on_commit`` (kept: identity marks it).
        self.callback = self.publish_all

    def publish_all(self) -> None:
        """Publish every row of the batch."""
        self.publish(tuple(self.messages))

    def is_registered(self, connection: Any) -> bool:
        """Whether Django will still call this batch when ``connection`` commits."""
        return any(entry[1] is self.callback for entry in connection.run_on_commit)


def defer(message: StoredMessage, publish: PublishCallback, *, using: str) -> None:
    """Publish ``message`` with ``publish`` right after the current commit of ``using``.

    Outside an atomic block ``publish([message])`` runs at once.
    """
    connection = transaction.get_connection(using)
    if not connection.in_atomic_block:
        publish((message,))
        return
    batch = _live_batch(connection, publish)
    if batch is None:
        batch = _new_batch(connection, publish, using=using)
    batch.messages.append(message)


def _live_batch(connection: Any, publish: PublishCallback) -> CommitBatch | None:
    batches: dict[Hashable, CommitBatch] = getattr(connection, _BATCHES_ATTR, {})
    batch = batches.get(publisher_key(publish))
    return batch if batch is not None and batch.is_registered(connection) else None


def _new_batch(connection: Any, publish: PublishCallback, *, using: str) -> CommitBatch:
    batches: dict[Hashable, CommitBatch] = getattr(connection, _BATCHES_ATTR, None) or {}
    # Drop batches Django already ran or discarded, so the dict never grows.
    batches = {key: b for key, b in batches.items() if b.is_registered(connection)}
    batch = CommitBatch(publish)
    batches[publisher_key(publish)] = batch
    setattr(connection, _BATCHES_ATTR, batches)
    # robust: a failing publisher never stops the caller's other on-commit callbacks.
    transaction.on_commit(batch.callback, using=using, robust=True)
    return batch


def publisher_key(publish: PublishCallback) -> Hashable:
    """A key equal for publishers that do the same thing.

    ``functools.partial(relay.publish_committed, using=alias)`` built anew for every
    dispatch; two such partials of the same function and arguments share a batch.
    """
    if isinstance(publish, functools.partial):
        try:
            key = (publisher_key(publish.func), publish.args, frozenset(publish.keywords.items()))
            hash(key)
        except TypeError:  # unhashable arguments: this publisher gets its own batch
            return publish
        return key
    return publish
