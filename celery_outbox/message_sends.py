"""One stored message handed to the broker as it was built at call time: through kombu's
``Producer.publish``, or into a part pushed at once on Redis
(:class:`~celery_outbox.redis_push.RedisPush`).

Each send bounds its socket waits by the pass's :class:`~celery_outbox.broker.Deadline`
(a pushed part checks it once, as it goes out at once) and publishes the stored body,
headers and properties unchanged, except a message TTL, shortened by the time the row
waited.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from datetime import datetime
from typing import Any, cast

from kombu import Connection, Producer

from celery_outbox import broker
from celery_outbox.broker import Deadline
from celery_outbox.broker_links import BrokerLinks
from celery_outbox.envelope import publish_body
from celery_outbox.records import NewMessage
from celery_outbox.redis_push import RedisPush

#: Sends one message of a part: ``(producer, message, headers, deadline)``.
Send = Callable[[Producer, NewMessage, dict[str, Any], Deadline], None]


class MessageSends:
    """The ways to send one message on the calling thread's ``links``.

    Parameters
    ----------
    links
        The thread's broker link (its connection and bound queues).
    clock
        The wall clock (shortens a message's TTL by the time it waited in the outbox).
    """

    def __init__(self, links: BrokerLinks, clock: Callable[[], datetime]) -> None:
        self.links, self.clock = links, clock

    def through_kombu(
        self, producer: Producer, message: NewMessage, headers: dict[str, Any], deadline: Deadline
    ) -> None:
        """``Producer.publish`` the message (into kombu's batch when one is open)."""
        options = message.options
        timeout = broker.bound(cast(Connection, self.links.connection), deadline)  # open
        producer.publish(
            publish_body(message.payload, options),
            exchange=options.get("exchange", ""),
            routing_key=options.get("routing_key", ""),
            headers=headers,
            content_type=options["content_type"],
            content_encoding=options["content_encoding"],
            delivery_mode=options.get("delivery_mode"),
            declare=self.links.queues(producer, options.get("declare") or ()),
            retry=False,
            timeout=timeout,
            confirm_timeout=timeout,
            **self.properties(options, headers),
        )
        deadline.progressed()

    def into(self, push: RedisPush, deadline: Deadline) -> Send:
        """A send that adds each message to ``push``'s part (pushed when its block ends).

        The part goes out at once, within the socket bounds its connection was opened
        with: ``deadline`` is checked here, once, not per message.
        """
        broker.bound(cast(Connection, self.links.connection), deadline)
        return functools.partial(self._push, push)

    def properties(self, options: dict[str, Any] | Any, headers: dict[str, Any]) -> dict[str, Any]:
        """The message properties of a stored message, its TTL counted from now."""
        properties = dict(options.get("properties") or {})
        expires = headers.get("expires")
        if expires and "expiration" in properties:
            # The TTL counts from the publish, so shorten it by the time spent waiting.
            left = datetime.fromisoformat(expires) - self.clock()
            properties["expiration"] = max(left.total_seconds(), 0.0)
        return properties

    def _push(
        self,
        push: RedisPush,
        producer: Producer,
        message: NewMessage,
        headers: dict[str, Any],
        deadline: Deadline,
    ) -> None:
        options = message.options
        push.add(
            publish_body(message.payload, options),
            options,
            headers,
            self.properties(options, headers),
        )
