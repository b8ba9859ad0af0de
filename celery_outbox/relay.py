"""Publish outbox rows to the broker, each exactly as it was built at call time."""

from __future__ import annotations

import functools
import logging
import random
import threading
from collections import defaultdict
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from celery import Celery
from kombu import Connection, Producer

from celery_outbox import broker
from celery_outbox.backoff import BackoffPolicy
from celery_outbox.broker import Deadline
from celery_outbox.clock import Clock, utcnow
from celery_outbox.config import OutboxConfig
from celery_outbox.envelope import decode_body, publish_body
from celery_outbox.exceptions import PayloadError
from celery_outbox.records import Claim, NewMessage, StoredMessage
from celery_outbox.signals import message_published
from celery_outbox.storage import OutboxStore, within_budget

logger = logging.getLogger(__name__)

#: Windows between publish attempts of one row (DESIGN.md: 1 s ... 5 min).
PUBLISH_BACKOFF = BackoffPolicy(base=timedelta(seconds=1), cap=timedelta(minutes=5))


@dataclass(frozen=True, kw_only=True)
class PublishReport:
    """What one publish pass did: rows that reached the broker, and rows that did not."""

    published: tuple[int, ...] = ()
    failed: dict[int, str] = field(default_factory=dict)
    #: Those of ``failed`` that are now ``failed`` for good (no more attempts).
    gave_up: frozenset[int] = frozenset()


class _Unpublishable(Exception):
    """A row that no retry can publish (unknown task, undecodable payload)."""


class Relay:
    """Publishes claimed rows through one broker connection per thread.

    Each publish pass waits at most about ``outbox_publish_timeout`` in all, whatever
    the number of rows and the transport (:mod:`celery_outbox.broker`), and never loops
    on a broker that is down or stalled: the rows are already safe in the outbox, and
    the sweeper tries again later. With RabbitMQ, publisher confirms are on: a row is
    marked only once the broker accepted its message.
    """

    #: Pipeline each claim's messages where the transport can (Redis): one round trip
    #: per claim. False publishes message by message (crash tests that need a claim
    #: half-published set it).
    batch_publish: bool = True

    def __init__(
        self,
        app: Celery,
        *,
        store: OutboxStore,
        config: OutboxConfig,
        clock: Clock = utcnow,
        rng: random.Random | None = None,
    ) -> None:
        self.app, self.store, self.config = app, store, config
        self.clock, self.rng = clock, rng or random.Random()
        self._local = threading.local()
        self._publishers: dict[str | None, Callable[[Sequence[StoredMessage]], PublishReport]] = {}

    def publisher(
        self, using: str | None = None
    ) -> Callable[[Sequence[StoredMessage]], PublishReport]:
        """The on-commit publisher of one database alias: always the same callable, so a
        store can tell that rows deferred with it belong to one batch."""
        publish = self._publishers.get(using)
        if publish is None:
            publish = self._publishers[using] = functools.partial(
                self.publish_committed, using=using
            )
        return publish

    # -- entry points -------------------------------------------------------------
    def publish_committed(
        self, messages: Sequence[StoredMessage], *, using: str | None = None
    ) -> PublishReport:
        """Publish the rows one transaction wrote, right after its commit. Never raises.

        Rows born leased whose lease still runs need no claim: they are published as
        they were built once one read has shown they were committed and are still
        theirs (a rolled-back savepoint leaves none). The others (the lease ran out
        in a long transaction, or the store does not lease) are claimed first.
        """
        try:
            now = self.clock()
            leased = [m for m in messages if m.locked_until is not None and m.locked_until > now]
            held = self.store.still_leased(leased, using=using) if leased else set()
            mine = tuple(m for m in leased if m.id in held)
            report = PublishReport()
            if mine:
                lease = max(m.locked_until or now for m in mine)
                claim = Claim(messages=mine, lease_until=lease)
                report = self.publish_claim(claim, using=using)
            others = [m.id for m in messages if m.locked_until is None or m.locked_until <= now]
            if others:
                report = _merged(report, self._claim_and_publish(others, using=using))
            return report
        except Exception:  # noqa: BLE001 - logged: an on-commit callback never raises
            _log_after_commit_failure(len(messages))
            return PublishReport()

    def publish_ids(
        self, ids: Sequence[int], *, using: str | None = None, validate: bool = True
    ) -> PublishReport:
        """Claim the rows ``ids`` and publish them (publish-now). Never raises.

        Rows are validated as the sweeper validates them (see :meth:`publish_claim`):
        a row of an unregistered task or with a refused payload becomes ``failed``.
        """
        try:
            return self._claim_and_publish(ids, using=using, validate=validate)
        except Exception:  # noqa: BLE001 - logged: an on-commit callback never raises
            _log_after_commit_failure(len(ids))
            return PublishReport()

    def _claim_and_publish(
        self, ids: Sequence[int], *, using: str | None, validate: bool = False
    ) -> PublishReport:
        # Claim by at most outbox_sweep_batch_bytes of payload at a time, so a long list
        # of large rows is never held in memory at once; each claim takes at least one row.
        report, left = PublishReport(), list(ids)
        while left:
            now = self.clock()
            claim = self.store.claim(
                left,
                now=now,
                lease_until=now + self.config.claim_lease,
                max_bytes=self.config.sweep_batch_bytes,
                using=using,
            )
            if not claim.messages:
                break
            report = _merged(report, self.publish_claim(claim, using=using, validate=validate))
            taken = {m.id for m in claim.messages}
            left = [i for i in left if i not in taken]
            del claim  # before the next claim loads its rows
        return report

    def publish_claim(
        self, claim: Claim, *, using: str | None = None, validate: bool = False
    ) -> PublishReport:
        """Publish every row of ``claim``, then mark or reschedule them (fenced).

        With ``validate`` (the sweeper), rows naming an unregistered task or holding an
        undecodable payload fail at once instead of being published.
        """
        if not claim.messages:
            return PublishReport()
        published, failed, fatal = self._send_in_parts(claim.messages, validate=validate)
        if published:
            self.store.mark_published(
                claim,
                published,
                now=self.clock(),
                keep=self.config.keep_published > timedelta(0),
                using=using,
            )
            sent = set(published)
            message_published.send(
                sender=self.app, task_ids=[m.task_id for m in claim.messages if m.id in sent]
            )
        self._record_failures(claim, failed, fatal, using=using)
        last_tries = {
            m.id
            for m in claim.messages
            if m.id in failed and m.attempts + 1 >= self.config.publish_max_attempts
        }
        return PublishReport(
            published=tuple(published),
            failed={**failed, **fatal},
            gave_up=frozenset(fatal) | last_tries,
        )

    def publish_message(self, message: NewMessage) -> None:
        """Publish one message now, bypassing the table (short retry waits).

        Raises whatever the broker raised, within about ``outbox_publish_timeout``; the
        caller parks the message instead.
        """
        deadline = self._deadline()
        try:
            self._publish_one(self._producer(deadline), message, deadline)
        except Exception:
            self._discard()
            raise

    def close(self) -> None:
        """Release this thread's broker connection (each of the broker's goodbyes is
        awaited at most ``outbox_publish_timeout``)."""
        conn = getattr(self._local, "connection", None)
        self._local.connection = None
        if conn is not None:
            broker.close(conn, self._deadline())

    def _discard(self) -> None:
        # After a failure: drop the connection without waiting for a stalled broker.
        conn = getattr(self._local, "connection", None)
        self._local.connection = None
        if conn is not None:
            broker.discard(conn)

    def _deadline(self) -> Deadline:
        return Deadline.after(self.config.publish_timeout)

    # -- sending --------------------------------------------------------------------
    def _send_in_parts(
        self, messages: Sequence[StoredMessage], *, validate: bool
    ) -> tuple[list[int], dict[int, str], dict[int, str]]:
        # A pipelined batch (Redis) holds every encoded body until it is flushed: send
        # outbox_sweep_batch_bytes of payload at a time, so a transaction of many large
        # dispatches never holds all of them encoded at once. A part that published
        # nothing leaves the rest unsent (the broker is unreachable): one wait, not one
        # per part.
        published: list[int] = []
        failed: dict[int, str] = {}
        fatal: dict[int, str] = {}
        start = 0
        while start < len(messages):
            rest = messages[start:]
            budget = self.config.sweep_batch_bytes
            part = rest[: within_budget((len(m.payload) for m in rest), budget)]
            start += len(part)
            sent, not_sent, bad = self._send(part, validate=validate)
            published += sent
            failed.update(not_sent)
            fatal.update(bad)
            if not_sent and not sent:
                error = next(iter(not_sent.values()))
                failed.update((m.id, error) for m in messages[start:])
                break
        return published, failed, fatal

    def _send(
        self, messages: Iterable[StoredMessage], *, validate: bool
    ) -> tuple[list[int], dict[int, str], dict[int, str]]:
        pending: list[StoredMessage] = []
        fatal: dict[int, str] = {}
        for message in messages:
            try:
                if validate:
                    self._validate(message)
            except _Unpublishable as exc:
                fatal[message.id] = str(exc)
            else:
                pending.append(message)
        if not pending:
            return [], {}, fatal
        # One deadline for the pass, renewed only when the broker accepts a message: a
        # stalled broker costs one wait, not one per row.
        deadline = self._deadline()
        try:
            producer = self._producer(deadline)
        except Exception as exc:  # noqa: BLE001 - unreachable broker: every row waits
            self._discard()
            return [], {m.id: _describe(exc) for m in pending}, fatal
        if self.batch_publish and _batches(producer):
            published, failed = self._publish_batch(producer, pending, deadline)
        else:
            published, failed = self._publish_each(pending, deadline)
        return published, failed, fatal

    def _publish_batch(
        self, producer: Producer, pending: list[StoredMessage], deadline: Deadline
    ) -> tuple[list[int], dict[int, str]]:
        # The transport pipelines (Redis): the whole claim goes out in one round trip
        # instead of one per message. max_size keeps kombu from flushing part of it
        # early, so on any error nothing was sent, or the flush failed and delivery is
        # uncertain: either way publish the rows again one by one (at least once), in
        # the time the pass has left. A timeout means the broker stalls: no fallback.
        try:
            size = _COMMANDS_PER_MESSAGE * len(pending)
            with producer.batch(max_size=size):  # type: ignore[attr-defined]
                for message in pending:
                    self._publish_one(producer, message, deadline)
        except Exception as exc:  # noqa: BLE001 - fall back: each row succeeds or fails alone
            self._discard()
            if broker.timed_out(exc):
                return [], {m.id: _describe(exc) for m in pending}
            return self._publish_each(pending, deadline)
        return [m.id for m in pending], {}

    def _publish_each(
        self, pending: list[StoredMessage], deadline: Deadline
    ) -> tuple[list[int], dict[int, str]]:
        published: list[int] = []
        failed: dict[int, str] = {}
        for index, message in enumerate(pending):
            try:
                producer = self._producer(deadline)
            except Exception as exc:  # noqa: BLE001 - unreachable broker: skip the rest
                self._discard()
                failed.update((m.id, _describe(exc)) for m in pending[index:])
                break
            try:
                self._publish_one(producer, message, deadline)
            except Exception as exc:  # noqa: BLE001 - any publish error: retry the row later
                self._discard()
                failed[message.id] = _describe(exc)
                if broker.timed_out(exc):  # stalled or out of time: the rest waits too
                    failed.update((m.id, _describe(exc)) for m in pending[index + 1 :])
                    break
            else:
                published.append(message.id)
        return published, failed

    def _validate(self, message: StoredMessage) -> None:
        if message.task_name not in self.app.tasks:
            raise _Unpublishable(f"task {message.task_name!r} is not registered with this app")
        try:
            decode_body(
                message.payload,
                message.options,
                accept=self.app.conf.accept_content,
                max_bytes=self.config.max_payload_bytes,
            )
        except PayloadError as exc:
            raise _Unpublishable(f"payload refused: {exc}") from exc
        except Exception as exc:
            raise _Unpublishable(f"payload cannot be decoded: {_describe(exc)}") from exc

    def _publish_one(self, producer: Producer, message: NewMessage, deadline: Deadline) -> None:
        options = message.options
        headers = dict(options.get("headers") or {})
        if "compression" in options:
            headers["compression"] = options["compression"]
        timeout = broker.bound(self._local.connection, deadline)  # the producer's
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
            self._discard()
            conn = None
        if conn is None:
            conn = broker.connect(self.app, deadline)
            self._local.connection = conn
            self._local.producer = None
            self._local.bound_queues = {}
        if self._local.producer is None:
            self._local.producer = self.app.amqp.Producer(conn, auto_declare=False)
        producer: Producer = self._local.producer
        return producer

    # -- failures -------------------------------------------------------------------
    def _record_failures(
        self, claim: Claim, failed: dict[int, str], fatal: dict[int, str], *, using: str | None
    ) -> None:
        attempts = {m.id: m.attempts for m in claim.messages}
        groups: dict[tuple[str, int], list[int]] = defaultdict(list)
        for message_id, error in failed.items():
            groups[(error, attempts[message_id])].append(message_id)
        for (error, tries), ids in groups.items():
            retry_at = self.clock() + PUBLISH_BACKOFF.delay_for(tries + 1, rng=self.rng)
            logger.warning(
                "celery-outbox: %d row(s) not published (%s); next try at %s",
                len(ids),
                error,
                retry_at.isoformat(),
            )
            self.store.record_failure(
                claim,
                ids,
                error=error,
                retry_at=retry_at,
                max_attempts=self.config.publish_max_attempts,
                using=using,
            )
        if fatal:
            for message_id, error in fatal.items():
                logger.error("celery-outbox: row %d failed for good: %s", message_id, error)
                self.store.record_failure(
                    claim,
                    [message_id],
                    error=error,
                    retry_at=None,
                    max_attempts=self.config.publish_max_attempts,
                    using=using,
                )


#: Upper bound of the transport commands one message adds to a publish batch (Redis: one
#: LPUSH, plus a PEXPIRE per priority step for queues with an expiry).
_COMMANDS_PER_MESSAGE = 16


def _batches(producer: Producer) -> bool:
    """Whether ``producer`` can pipeline publishes (kombu >= 5.7 on Redis)."""
    channel = producer.channel
    return (
        hasattr(producer, "batch")
        and getattr(channel, "create_publish_batch", None) is not None
        and bool(getattr(channel, "supports_batch_publish", True))
    )


def _log_after_commit_failure(count: int) -> None:
    # An on-commit callback must never raise into the caller or stop Django's other
    # callbacks; the rows are committed and the sweeper will publish them.
    logger.exception(
        "celery-outbox: publishing %d row(s) after commit failed; the sweeper will publish them",
        count,
    )


def _merged(first: PublishReport, second: PublishReport) -> PublishReport:
    return PublishReport(
        published=first.published + second.published,
        failed={**first.failed, **second.failed},
        gave_up=first.gave_up | second.gave_up,
    )


def _describe(exc: BaseException) -> str:
    return f"{type(exc).__module__}.{type(exc).__qualname__}: {exc}"[:2000]
