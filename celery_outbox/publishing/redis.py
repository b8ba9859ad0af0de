"""A part of stored messages pushed to kombu's Redis transport in one pipeline, as kombu
would push them, without kombu's work per message.

Through kombu, each message of a sweep's part went through ``Producer.publish`` (its
arguments, a declare check, a publish batch's list of commands) and got a ``uuid4``
delivery tag (an ``os.urandom`` call): about two fifths of a sweeping process's Python.
For a part whose every message goes to the default exchange (Celery's routing for a
plain queue), :class:`RedisPush` builds the very JSON kombu's Redis channel pushes, with
kombu's own ``prepare_message``, priority and key rules, and pushes the part with one
pipeline of the channel's client. A delivery tag only has to be unique: each channel
draws a random ``uuid4`` once and counts in its last twelve hex digits (still a version 4
UUID's layout; 74 random bits tell one channel's tags from another's, and a forked
process draws its own).

This leans on kombu's Redis channel (its message layout, ``_q_for_pri``,
``_get_message_priority``, ``_expires``, ``priority_steps``, ``conn_or_acquire``) and on
``Producer._delivery_details``; ``tests/unit/publishing/test_redis.py`` pushes the same
messages both ways to a real Redis and fails, by name, when an upgrade changes either.
"""

from __future__ import annotations

import inspect
import itertools
import os
import uuid
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from kombu import Producer
from kombu.utils.json import dumps

from celery_outbox.publishing import broker

#: The channel's names this module calls (kombu's Redis ``Channel``).
_CHANNEL_NAMES = (
    "prepare_message",
    "encode_body",
    "body_encoding",
    "_q_for_pri",
    "_get_message_priority",
    "priority_steps",
    "conn_or_acquire",
)
#: ``Producer.publish``'s own parameters: a stored property named like one of these is an
#: argument there, not a message property (priority and expiration are handled here).
_PUBLISH_PARAMETERS = frozenset(inspect.signature(Producer.publish).parameters) - {
    "priority",
    "expiration",
    "properties",
}


class RedisPush:
    """Pushes parts of messages onto kombu's Redis ``producer``'s channel, each part in one
    pipeline (use :meth:`of`, which says whether the transport allows it).
    """

    def __init__(self, producer: Producer) -> None:
        self.producer: Any = producer
        self.channel: Any = producer.channel
        self._tag_pid = 0
        self._tag_prefix = ""
        self._tags = itertools.count()
        self._lists: dict[str, list[str]] = {}
        self._expiring: dict[str, Any] = {}

    @classmethod
    def of(cls, producer: Producer) -> RedisPush | None:
        """A push for ``producer``, or ``None`` unless its channel is kombu's Redis channel
        (and the producer compresses nothing itself).
        """
        channel: Any = producer.channel
        if getattr(channel.connection, "driver_name", None) != broker.REDIS:
            return None
        if producer.compression or not all(hasattr(channel, n) for n in _CHANNEL_NAMES):
            return None
        return cls(producer)

    def takes(self, options: Mapping[str, Any]) -> bool:
        """Whether a stored message of ``options`` can be pushed here: it goes to the
        default exchange, and holds no property that ``Producer.publish`` would read as
        one of its arguments (the others go to kombu, as before).
        """
        if options.get("exchange") or self.producer.exchange.name:
            return False
        return not _PUBLISH_PARAMETERS.intersection(options.get("properties") or ())

    def add(
        self,
        body: bytes,
        options: Mapping[str, Any],
        headers: dict[str, Any],
        properties: dict[str, Any],
    ) -> None:
        """Buffer one message: ``body`` as stored, with ``headers`` and ``properties`` as
        they would be handed to ``Producer.publish`` (fresh dicts: the message keeps them).
        """
        channel = self.channel
        queue = options.get("routing_key", "")
        priority = properties.pop("priority", 0)
        expiration = properties.pop("expiration", None)
        _, properties["delivery_mode"] = self.producer._delivery_details(
            self.producer.exchange, options.get("delivery_mode")
        )
        if expiration is not None:
            properties["expiration"] = str(int(expiration * 1000))
        message = channel.prepare_message(
            body,
            priority,
            options["content_type"],
            options["content_encoding"],
            headers,
            properties,
        )
        message["body"], body_encoding = channel.encode_body(body, channel.body_encoding)
        message["properties"].update(body_encoding=body_encoding, delivery_tag=self._tag())
        message["properties"]["delivery_info"].update(exchange="", routing_key=queue)
        key = channel._q_for_pri(queue, channel._get_message_priority(message))
        self._lists.setdefault(key, []).append(dumps(message))
        expires = getattr(channel, "_expires", None)
        if expires and queue in expires:
            self._expiring[queue] = expires[queue]

    @contextmanager
    def pushing(self) -> Iterator[None]:
        """Buffer the messages :meth:`add`\\ ed in the block; push them all at its end, in
        one pipeline (nothing is pushed when the block raises).

        One ``LPUSH`` per list with all of its messages, in the order added: the list
        ends as after one ``LPUSH`` per message (consumers pop the first added first),
        with one command to build, send and answer instead of hundreds. Then kombu's
        expiry of each expiring queue's lists, as kombu sets it after each message.
        """
        self._lists = {}
        self._expiring = {}
        try:
            yield
            if len(self._lists) == 1 and not self._expiring:  # one command: no pipeline
                with self.channel.conn_or_acquire() as client:
                    for key, messages in self._lists.items():
                        client.lpush(key, *messages)
                return
            with (
                self.channel.conn_or_acquire() as client,
                client.pipeline(transaction=False) as pipeline,
            ):
                for key, messages in self._lists.items():
                    pipeline.lpush(key, *messages)
                for queue, expiry in self._expiring.items():
                    for step in self.channel.priority_steps:
                        pipeline.pexpire(self.channel._q_for_pri(queue, step), expiry)
                pipeline.execute()
        finally:
            self._lists = {}
            self._expiring = {}

    def _tag(self) -> str:
        # A forked child inherits this object: it draws a prefix of its own, or two
        # processes would hand out the same tags (kombu's unacked messages are kept by tag).
        if self._tag_pid != os.getpid():
            self._tag_pid = os.getpid()
            self._tag_prefix = str(uuid.uuid4())[:24]
            self._tags = itertools.count()
        return f"{self._tag_prefix}{next(self._tags) % 16**12:012x}"
