"""Each thread's link to the broker: its connection, producer, bound queues and confirms.

:class:`~celery_outbox.publishing.producers.Producers` publishes through one link per thread. A link
opens its connection within a pass's :class:`~celery_outbox.publishing.broker.Deadline`, reopens it
when it was lost (rather than let kombu reconnect with the bounds of another pass), and
drops it without a handshake after a failure. The transport internals live in
:mod:`celery_outbox.publishing.broker`.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from typing import Any

from celery import Celery
from kombu import Connection, Producer

from celery_outbox.publishing import broker
from celery_outbox.publishing.broker import Deadline
from celery_outbox.publishing.redis import RedisPush


class BrokerLinks(threading.local):
    """The calling thread's link to ``app``'s write broker (a thread-local: one per thread).

    Attributes
    ----------
    connection
        The open connection, None before the first publish and after a close or failure.
    producer
        The producer on the connection's default channel.
    pipelines
        Whether the producer can pipeline publishes (kombu >= 5.7 on Redis).
    push
        The producer's :class:`~celery_outbox.publishing.redis.RedisPush` where the producer
        pipelines on kombu's Redis transport (a part in one pipeline, without kombu's
        work per message), else None.
    confirms
        The publisher confirms of its channel (RabbitMQ), else None.
    """

    def __init__(self, app: Celery) -> None:
        self.app = app
        self.connection: Connection | None = None
        self.producer: Producer | None = None
        self.pipelines = False
        self.push: RedisPush | None = None
        self.confirms: broker.Confirms | None = None
        self._bound_queues: dict[str, Any] = {}

    def open(self, deadline: Deadline) -> Producer:
        """The producer, on a connection opened within ``deadline`` if none is open.

        Raises
        ------
        PublishDeadlineError
            No time is left to open one.
        Exception
            Whatever the transport raised while connecting.
        """
        if self.connection is not None and not self.connection.connected:
            self.discard()
        if self.connection is None:
            self.connection = broker.connect(self.app, deadline)
            self.producer = None
            self._bound_queues = {}
        if self.producer is None:
            self.producer = self.app.amqp.Producer(self.connection, auto_declare=False)
            channel = self.producer.channel
            broker.reuse_client(channel)
            self.pipelines = hasattr(self.producer, "batch") and (
                getattr(channel, "create_publish_batch", None) is not None
                and bool(getattr(channel, "supports_batch_publish", True))
            )
            self.confirms = broker.confirms(channel)
            self.push = RedisPush.of(self.producer) if self.pipelines else None
        return self.producer

    def queues(self, producer: Producer, names: Iterable[str]) -> list[Any]:
        """The queues ``names`` of the app, bound to ``producer``'s channel.

        Bound once per channel: kombu copies and binds an unbound queue on every publish
        that declares it, half the cost of a publish in a batch.
        """
        channel: Any = producer.channel
        queues = []
        for name in names:
            queue = self._bound_queues.get(name)
            if queue is None or queue.channel is not channel:
                queue = self._bound_queues[name] = self.app.amqp.queues[name].bind(channel)
            queues.append(queue)
        return queues

    def declare(self, producer: Producer, names: Iterable[str]) -> None:
        """Declare the queues ``names`` on ``producer``'s channel, as kombu does before a
        publish (once per channel: kombu remembers them).
        """
        for queue in self.queues(producer, sorted(names)):
            producer.maybe_declare(queue, retry=False)

    def close(self, deadline: Deadline) -> None:
        """Release the connection, each goodbye awaited at most the time ``deadline`` leaves."""
        conn = self.connection
        self.connection = None
        if conn is not None:
            broker.close(conn, deadline)

    def discard(self) -> None:
        """After a failure: drop the connection without waiting for a stalled broker."""
        conn = self.connection
        self.connection = None
        if conn is not None:
            broker.discard(conn)
