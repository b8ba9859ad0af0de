"""The publish pass: stored messages handed to kombu's producers.

One stored message handed to the broker as it was built at call time: through kombu's
``Producer.publish``, or into a part pushed at once on Redis
(:class:`~celery_outbox.publishing.redis.RedisPush`).

Each send bounds its socket waits by the pass's :class:`~celery_outbox.publishing.broker.Deadline`
(a pushed part checks it once, as it goes out at once) and publishes the stored body,
headers and properties unchanged, except a message TTL, shortened by the time the row
waited.

The publish pass, through one broker connection per thread (:mod:`.broker_links`).

:class:`Producers` sends rows exactly as they were built at call time, within one
:class:`~celery_outbox.publishing.broker.Deadline` per pass (renewed only when the broker accepts a
message), a part of ``outbox_sweep_batch_bytes`` at once where the transport can
(pipelined on Redis, confirmed with one wait on RabbitMQ), message by message otherwise.
It never loops on a broker that is down or stalled: it reports which rows reached the
broker and why the others did not, and the relay records that. The transport internals
live in :mod:`celery_outbox.publishing.broker`.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, cast

from celery import Celery
from kombu import Connection, Producer

from celery_outbox import tracing
from celery_outbox.dispatch.envelope import publish_body, publish_headers
from celery_outbox.publishing import broker
from celery_outbox.publishing.broker import Deadline
from celery_outbox.publishing.links import BrokerLinks
from celery_outbox.publishing.redis import RedisPush
from celery_outbox.store.base import within_budget
from celery_outbox.store.records import NewMessage, StoredMessage

# --- One stored message handed to the broker as it was built at call time: through kombu's

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
        self.links = links
        self.clock = clock

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


# --- The publish pass, through one broker connection per thread (:mod:`.broker_links`).

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

    #: Publish each part's messages at once where the transport can (Redis: pipelined;
    #: RabbitMQ: one wait for their confirms): one round trip per part. False publishes
    #: message by message (crash tests that need a claim half-published set it).
    batch_publish: bool = True

    def __init__(
        self,
        app: Celery,
        *,
        timeout: timedelta,
        batch_bytes: int,
        clock: Callable[[], datetime],
    ) -> None:
        self.app = app
        self.timeout = timeout
        self.batch_bytes = batch_bytes
        self.clock = clock
        self._local = BrokerLinks(app)
        self._sends = MessageSends(self._local, clock)

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
            self.publish_one(self._local.open(deadline), message, deadline, path=path)
        except Exception:
            self.discard()
            raise

    def connect(self) -> None:
        """Open this thread's connection now, within ``timeout`` (else on the first publish)."""
        self._local.open(Deadline.after(self.timeout))

    def close(self) -> None:
        """Release this thread's connection (each goodbye awaited at most ``timeout``)."""
        self._local.close(Deadline.after(self.timeout))

    def discard(self) -> None:
        """After a failure: drop the connection without waiting for a stalled broker."""
        self._local.discard()

    def _send_part(self, pending: Sequence[StoredMessage], path: str) -> Sent:
        # One deadline for the part, renewed only when the broker accepts a message: a
        # stalled broker costs one wait, not one per row.
        deadline = Deadline.after(self.timeout)
        try:
            producer = self._local.open(deadline)
        except Exception as exc:  # noqa: BLE001 - unreachable broker: every row waits
            self.discard()
            return Sent(failed={m.id: describe(exc) for m in pending})
        confirms = self._local.confirms
        if self.batch_publish and confirms is not None and len(pending) > 1:
            return self._publish_confirmed(producer, confirms, pending, deadline, path)
        if self.batch_publish and self._local.pipelines:
            push = self._local.push
            if len(pending) == 1 and (push is None or not push.takes(pending[0].options)):
                return self._publish_single(producer, pending[0], deadline, path)
            return self._publish_batch(producer, pending, deadline, path)
        return self._publish_each(pending, deadline, path)

    def _publish_single(
        self, producer: Producer, message: StoredMessage, deadline: Deadline, path: str
    ) -> Sent:
        # One message kombu publishes (the on-commit publish of a one-task transaction,
        # where no push takes it) needs no kombu batch, which costs more to set up than
        # the publish: published directly, and after a failure tried once more on a
        # fresh connection, as a failed batch is. A pushed one is a part of one.
        try:
            self.publish_one(producer, message, deadline, path=path)
        except Exception as exc:  # noqa: BLE001 - as a batch: once more, then the row waits
            return self._fall_back([message], exc, deadline, path)
        return Sent(published=[message.id])

    def _publish_batch(
        self, producer: Producer, pending: Sequence[StoredMessage], deadline: Deadline, path: str
    ) -> Sent:
        # The transport pipelines (Redis): the whole part goes out in one round trip
        # instead of one per message, so on any error nothing was sent, or the flush
        # failed and delivery is uncertain: either way the rows are published again one
        # by one. A part for the default exchange is pushed as kombu would push it
        # (:mod:`.redis_push`); others go through kombu's batch, whose max_size keeps it
        # from flushing part of it early.
        push = self._local.push
        try:
            if push is not None and all(push.takes(m.options) for m in pending):
                self._local.declare(
                    producer, {n for m in pending for n in m.options.get("declare") or ()}
                )
                within = push.pushing()
                send = self._sends.into(push, deadline)
            else:
                size = _COMMANDS_PER_MESSAGE * len(pending)
                within = producer.batch(max_size=size)  # type: ignore[attr-defined]
                send = self._sends.through_kombu
            with self._publishing_all(producer, pending, deadline, path, within, send):
                pass  # the pipeline is flushed when ``within`` ends
        except Exception as exc:  # noqa: BLE001 - fall back: each row succeeds or fails alone
            return self._fall_back(pending, exc, deadline, path)
        deadline.progressed()
        return Sent(published=[m.id for m in pending])

    def _publish_confirmed(
        self,
        producer: Producer,
        confirms: broker.Confirms,
        pending: Sequence[StoredMessage],
        deadline: Deadline,
        path: str,
    ) -> Sent:
        # Publisher confirms (RabbitMQ): the part goes out, then one wait for all its
        # confirms (not a round trip per message). A row is published once its message is
        # acked, failed if nacked; after an error, the rows not acked are published again.
        try:
            with self._publishing_all(
                producer, pending, deadline, path, confirms.unawaited(), self._sends.through_kombu
            ):
                acks = confirms.wait(deadline)
        except Exception as exc:  # noqa: BLE001 - fall back: each row succeeds or fails alone
            acked = [m.id for m, ok in zip(pending, confirms.outcomes(), strict=False) if ok]
            done = set(acked)
            rest = [m for m in pending if m.id not in done]
            again = self._fall_back(rest, exc, deadline, path)
            return Sent(published=acked + again.published, failed=again.failed)
        outcomes = dict(zip((m.id for m in pending), acks, strict=True))
        return Sent(
            published=[id_ for id_, ok in outcomes.items() if ok],
            failed={id_: broker.Confirms.NACKED for id_, ok in outcomes.items() if not ok},
        )

    @contextmanager
    def _publishing_all(
        self,
        producer: Producer,
        pending: Sequence[StoredMessage],
        deadline: Deadline,
        path: str,
        within: AbstractContextManager[Any],
        send: Send,
    ) -> Iterator[None]:
        # Publishes a part sent at once, within ``within`` (the pipeline, or no waits for
        # confirms), each message by ``send``, in spans (tracing.publishing_batch) that
        # end when the block does.
        traced = [(publish_headers(m.options), m.available_at, m.task_name) for m in pending]
        with tracing.publishing_batch(traced, path=path, clock=self.clock) as spanned:
            with within:
                for message, (headers, _, _), batched in zip(pending, traced, spanned, strict=True):
                    if batched:  # its headers carry the batch's span
                        send(producer, message, headers, deadline)
                    else:
                        self.publish_one(
                            producer, message, deadline, path=path, send=send, headers=headers
                        )
            yield

    def _fall_back(
        self, pending: Sequence[StoredMessage], exc: Exception, deadline: Deadline, path: str
    ) -> Sent:
        # After a part failed, whether its messages reached the broker is unknown: its
        # rows are published again one by one (at least once) on a fresh connection, in
        # the time the pass has left. A timeout means the broker stalls: they all wait.
        self.discard()
        if broker.timed_out(exc):
            return Sent(failed={m.id: describe(exc) for m in pending})
        return self._publish_each(pending, deadline, path)

    def _publish_each(
        self, pending: Sequence[StoredMessage], deadline: Deadline, path: str
    ) -> Sent:
        sent = Sent()
        for index, message in enumerate(pending):
            try:
                producer = self._local.open(deadline)
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
        self,
        producer: Producer,
        message: NewMessage,
        deadline: Deadline,
        *,
        path: str,
        send: Send | None = None,
        headers: dict[str, Any] | None = None,
    ) -> None:
        """Publish ``message`` as it was built (by ``send``, default: through kombu), its
        socket waits bounded by ``deadline``, in the trace it was dispatched in (a
        ``celery_outbox.publish`` span of ``path``); ``headers``: its publish headers
        when the caller has them already.
        """
        if headers is None:
            headers = publish_headers(message.options)
        with tracing.publishing(
            headers,
            path=path,
            task_name=message.task_name,
            task_id=message.task_id,
            due=message.available_at,
            clock=self.clock,
        ):
            (send or self._sends.through_kombu)(producer, message, headers, deadline)


def describe(exc: BaseException) -> str:
    """``module.Type: message`` of ``exc``, at most 2000 characters (a row's ``last_error``)."""
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"[:2000]
