"""The publish pass: one broker connection, producer and bound queues per thread.

:class:`Producers` sends rows exactly as they were built at call time, within one
:class:`~celery_outbox.broker.Deadline` per pass (renewed only when the broker accepts a
message), pipelined per part of ``outbox_sweep_batch_bytes`` where the transport can
(Redis), message by message otherwise. It never loops on a broker that is down or
stalled: it reports which rows reached the broker and why the others did not, and the
relay records that. The transport internals live in :mod:`celery_outbox.broker`.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery import Celery
from kombu import Connection, Producer

from celery_outbox import broker, tracing
from celery_outbox.broker import Deadline
from celery_outbox.envelope import publish_body
from celery_outbox.records import NewMessage, StoredMessage
from celery_outbox.storage import within_budget

#: Upper bound of the transport commands one message adds to a publish batch (Redis: one
#: LPUSH, plus a PEXPIRE per priority step for queues with an expiry).
_COMMANDS_PER_MESSAGE = 16


@dataclass(frozen=True, kw_only=True)
class Sent:
    """What a publish pass did: the rows the broker accepted, and why the others were not."""

    published: list[int] = field(default_factory=list)
    failed: dict[int, str] = field(default_factory=dict)


class Producers:
    """Publishes through one broker connection per thread, reopened after a failure.

    Parameters
    ----------
    app
        The Celery app whose write broker, producer class and queues are used.
    timeout
        ``outbox_publish_timeout``: how long a pass waits for a broker that accepts nothing.
    batch_bytes
        ``outbox_sweep_batch_bytes``: the payload one pipelined part holds at most.
    clock
        The wall clock (shortens a message's TTL by the time it waited in the outbox).
    """

    #: Pipeline each part's messages where the transport can (Redis): one round trip
    #: per part. False publishes message by message (crash tests that need a claim
    #: half-published set it).
    batch_publish: bool = True

    def __init__(
        self,
        app: Celery,
        *,
        timeout: timedelta,
        batch_bytes: int,
        clock: Callable[[], datetime],
    ) -> None:
        self.app, self.timeout, self.batch_bytes, self.clock = app, timeout, batch_bytes, clock
        self._local = threading.local()

    # -- passes ----------------------------------------------------------------------
    def send(self, messages: Sequence[StoredMessage], *, path: str) -> Sent:
        """Publish ``messages`` in parts of at most ``batch_bytes`` of payload. Never raises.

        ``path`` names the entry point publishing them (the publish span's attribute).

        A pipelined part holds every encoded body until it is flushed, so a transaction
        of many large rows never holds all of them encoded at once. A part that
        published nothing leaves the rest unsent (the broker is unreachable): one wait,
        not one per part.
        """
        sent = Sent()
        start = 0
        while start < len(messages):
            rest = messages[start:]
            part = rest[: within_budget((len(m.payload) for m in rest), self.batch_bytes)]
            start += len(part)
            done = self._send_part(part, path)
            sent.published.extend(done.published)
            sent.failed.update(done.failed)
            if done.failed and not done.published:
                error = next(iter(done.failed.values()))
                sent.failed.update((m.id, error) for m in messages[start:])
                break
        return sent

    def publish_message(self, message: NewMessage, *, path: str) -> None:
        """Publish one message now; raise whatever the broker raised, within ``timeout``."""
        deadline = Deadline.after(self.timeout)
        try:
            self.publish_one(self._producer(deadline), message, deadline, path=path)
        except Exception:
            self.discard()
            raise

    def connect(self) -> None:
        """Open this thread's connection now, within ``timeout`` (else on the first publish)."""
        self._producer(Deadline.after(self.timeout))

    def close(self) -> None:
        """Release this thread's connection (each goodbye awaited at most ``timeout``)."""
        conn = getattr(self._local, "connection", None)
        self._local.connection = None
        if conn is not None:
            broker.close(conn, Deadline.after(self.timeout))

    def discard(self) -> None:
        """After a failure: drop the connection without waiting for a stalled broker."""
        conn = getattr(self._local, "connection", None)
        self._local.connection = None
        if conn is not None:
            broker.discard(conn)

    def _send_part(self, pending: Sequence[StoredMessage], path: str) -> Sent:
        # One deadline for the part, renewed only when the broker accepts a message: a
        # stalled broker costs one wait, not one per row.
        deadline = Deadline.after(self.timeout)
        try:
            producer = self._producer(deadline)
        except Exception as exc:  # noqa: BLE001 - unreachable broker: every row waits
            self.discard()
            return Sent(failed={m.id: describe(exc) for m in pending})
        if self.batch_publish and _batches(producer):
            if len(pending) == 1:
                return self._publish_single(producer, pending[0], deadline, path)
            return self._publish_batch(producer, pending, deadline, path)
        return self._publish_each(pending, deadline, path)

    def _publish_single(
        self, producer: Producer, message: StoredMessage, deadline: Deadline, path: str
    ) -> Sent:
        # One message needs no pipeline, which costs more to set up than the publish
        # (the on-commit publish of a one-task transaction): published directly, and
        # after a failure tried once more on a fresh connection, as a failed batch is.
        try:
            self.publish_one(producer, message, deadline, path=path)
        except Exception as exc:  # noqa: BLE001 - as a batch: once more, then the row waits
            self.discard()
            if broker.timed_out(exc):
                return Sent(failed={message.id: describe(exc)})
            return self._publish_each([message], deadline, path)
        return Sent(published=[message.id])

    def _publish_batch(
        self, producer: Producer, pending: Sequence[StoredMessage], deadline: Deadline, path: str
    ) -> Sent:
        # The transport pipelines (Redis): the whole part goes out in one round trip
        # instead of one per message. max_size keeps kombu from flushing part of it
        # early, so on any error nothing was sent, or the flush failed and delivery is
        # uncertain: either way publish the rows again one by one (at least once), in
        # the time the pass has left. A timeout means the broker stalls: no fallback.
        try:
            size = _COMMANDS_PER_MESSAGE * len(pending)
            with producer.batch(max_size=size):  # type: ignore[attr-defined]
                for message in pending:
                    self.publish_one(producer, message, deadline, path=path)
        except Exception as exc:  # noqa: BLE001 - fall back: each row succeeds or fails alone
            self.discard()
            if broker.timed_out(exc):
                return Sent(failed={m.id: describe(exc) for m in pending})
            return self._publish_each(pending, deadline, path)
        return Sent(published=[m.id for m in pending])

    def _publish_each(
        self, pending: Sequence[StoredMessage], deadline: Deadline, path: str
    ) -> Sent:
        sent = Sent()
        for index, message in enumerate(pending):
            try:
                producer = self._producer(deadline)
            except Exception as exc:  # noqa: BLE001 - unreachable broker: skip the rest
                self.discard()
                sent.failed.update((m.id, describe(exc)) for m in pending[index:])
                break
            try:
                self.publish_one(producer, message, deadline, path=path)
            except Exception as exc:  # noqa: BLE001 - any publish error: retry the row later
                self.discard()
                sent.failed[message.id] = describe(exc)
                if broker.timed_out(exc):  # stalled or out of time: the rest waits too
                    sent.failed.update((m.id, describe(exc)) for m in pending[index + 1 :])
                    break
            else:
                sent.published.append(message.id)
        return sent

    # -- one message -------------------------------------------------------------------
    def publish_one(
        self, producer: Producer, message: NewMessage, deadline: Deadline, *, path: str
    ) -> None:
        """Publish ``message`` as it was built, its socket waits bounded by ``deadline``,
        in the trace it was dispatched in (a ``celery_outbox.publish`` span of ``path``)."""
        options = message.options
        headers = dict(options.get("headers") or {})
        if "compression" in options:
            headers["compression"] = options["compression"]
        timeout = broker.bound(self._local.connection, deadline)  # the producer's
        with tracing.publishing(
            headers,
            path=path,
            task_name=message.task_name,
            task_id=message.task_id,
            due=message.available_at,
            clock=self.clock,
        ):
            producer.publish(
                publish_body(message.payload, options),
                exchange=options.get("exchange", ""),
                routing_key=options.get("routing_key", ""),
                headers=headers,
                content_type=options["content_type"],
                content_encoding=options["content_encoding"],
                delivery_mode=options.get("delivery_mode"),
                declare=self._queues(producer, options.get("declare") or ()),
                retry=False,
                timeout=timeout,
                confirm_timeout=timeout,
                **self._properties(options, headers),
            )
        deadline.progressed()

    def _properties(self, options: dict[str, Any] | Any, headers: dict[str, Any]) -> dict[str, Any]:
        properties = dict(options.get("properties") or {})
        expires = headers.get("expires")
        if expires and "expiration" in properties:
            # The TTL counts from the publish, so shorten it by the time spent waiting.
            left = datetime.fromisoformat(expires) - self.clock()
            properties["expiration"] = max(left.total_seconds(), 0.0)
        return properties

    # -- the per-thread cache ------------------------------------------------------------
    def _queues(self, producer: Producer, names: Iterable[str]) -> list[Any]:
        # Bound to the producer's channel once: kombu copies and binds an unbound queue
        # on every publish that declares it, half the cost of a publish in a batch.
        bound: dict[str, Any] = self._local.bound_queues
        channel: Any = producer.channel
        queues = []
        for name in names:
            queue = bound.get(name)
            if queue is None or queue.channel is not channel:
                queue = bound[name] = self.app.amqp.queues[name].bind(channel)
            queues.append(queue)
        return queues

    def _producer(self, deadline: Deadline) -> Producer:
        conn: Connection | None = getattr(self._local, "connection", None)
        if conn is not None and not conn.connected:
            # Reopen rather than let kombu reconnect with the bounds of another pass.
            self.discard()
            conn = None
        if conn is None:
            conn = broker.connect(self.app, deadline)
            self._local.connection = conn
            self._local.producer = None
            self._local.bound_queues = {}
        if self._local.producer is None:
            self._local.producer = self.app.amqp.Producer(conn, auto_declare=False)
            broker.reuse_client(self._local.producer.channel)
        producer: Producer = self._local.producer
        return producer


def _batches(producer: Producer) -> bool:
    """Whether ``producer`` can pipeline publishes (kombu >= 5.7 on Redis)."""
    channel = producer.channel
    return (
        hasattr(producer, "batch")
        and getattr(channel, "create_publish_batch", None) is not None
        and bool(getattr(channel, "supports_batch_publish", True))
    )


def describe(exc: BaseException) -> str:
    """``module.Type: message`` of ``exc``, at most 2000 characters (a row's ``last_error``)."""
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"[:2000]
