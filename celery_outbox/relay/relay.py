"""The relay: which stored rows may be published, and publishing them.

Whether a stored row can be published at all: the sweeper's check before it publishes.

A row naming a task this app does not know, or holding a payload that cannot be decoded
(or that the app's ``accept_content`` or ``outbox_max_payload_bytes`` refuses), would fail
on every attempt: the relay fails it for good at once instead of retrying it.

Publish outbox rows to the broker, each exactly as it was built at call time.

The relay's entry points (after commit, publish-now, a sweep's claim, a retry that
bypasses the table) and the bookkeeping of their outcome. Talking to the broker is
:mod:`celery_outbox.publishing.producers`; whether a row can be published at all is
:mod:`celery_outbox.relay.relay`; when a row gives up (``outbox_publish_max_attempts``)
is decided here, once, and the store only records it.
"""

from __future__ import annotations

import functools
import json
import random
from collections import defaultdict
from collections.abc import Callable, Collection, Container, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any, Literal, cast

from celery import Celery
from kombu.exceptions import SerializerNotInstalled
from kombu.serialization import prepare_accept_content

from celery_outbox.backoff import BackoffPolicy
from celery_outbox.clock import Clock, utcnow
from celery_outbox.config import OutboxConfig
from celery_outbox.dispatch.envelope import BODY_ENCODING_BASE64, decode_body
from celery_outbox.exceptions import PayloadError
from celery_outbox.long_text import bounded_logger
from celery_outbox.publishing.producers import Producers, describe
from celery_outbox.registry import store_for
from celery_outbox.signals import message_publish_failed, message_published
from celery_outbox.state import state_of
from celery_outbox.store.base import OutboxStore
from celery_outbox.store.records import Claim, NewMessage, StoredMessage

logger = bounded_logger(__name__)


# --- Whether a stored row can be published at all: the sweeper's check before it publishes.


def refusal(app: Celery, message: StoredMessage, *, max_payload_bytes: int | None) -> str | None:
    """Why no retry can publish ``message`` (an error text for the row), or ``None``."""
    return _refusal(app.tasks, _accepted(app), message, max_payload_bytes)


def sort_out(
    app: Celery, messages: Iterable[StoredMessage], *, max_payload_bytes: int | None
) -> tuple[list[StoredMessage], dict[int, str]]:
    """``messages`` split into those that can be published and, by id, why the others cannot."""
    # Read once per batch, not per row: a lookup in Celery's settings costs about a third
    # of a row's check.
    tasks = app.tasks
    accept = _accepted(app)
    publishable: list[StoredMessage] = []
    refused: dict[int, str] = {}
    for message in messages:
        reason = _refusal(tasks, accept, message, max_payload_bytes)
        if reason is None:
            publishable.append(message)
        else:
            refused[message.id] = reason
    return publishable, refused


def _refusal(
    tasks: Container[str],
    accept: Collection[str] | None,
    message: StoredMessage,
    max_payload_bytes: int | None,
) -> str | None:
    if message.task_name not in tasks:
        return f"task {message.task_name!r} is not registered with this app"
    if accept is not None and JSON in accept and _plain_json(message.payload, message.options):
        return None
    try:
        decode_body(message.payload, message.options, accept=accept, max_bytes=max_payload_bytes)
    except PayloadError as exc:
        return f"payload refused: {exc}"
    except Exception as exc:  # noqa: BLE001 - any decoding error: the row is unpublishable
        return f"payload cannot be decoded: {describe(exc)}"
    return None


#: The content type of Celery's default serializer.
JSON = "application/json"


def _accepted(app: Celery) -> Collection[str] | None:
    # The content types the app accepts (Celery's default: JSON only), as decode_body
    # reads them; a serializer name kombu does not know is left for decode_body to name.
    accept = app.conf.accept_content
    try:
        return prepare_accept_content(accept or ["json"]) or set()
    except SerializerNotInstalled:
        return cast("Collection[str] | None", accept)


def _plain_json(payload: str, options: Mapping[str, Any]) -> bool:
    # Whether the payload is JSON text that kombu's decoder would return unchanged: its
    # hook only turns objects keyed "__type__" (which an escape can spell), so without
    # either one plain json.loads accepts exactly what it accepts, at a fraction of the
    # cost (the sweeper checks every row). Anything else, or an error, takes kombu's path.
    if options.get("content_type") != JSON or options.get("content_encoding") != "utf-8":
        return False
    if "compression" in options or options.get("body_encoding") == BODY_ENCODING_BASE64:
        return False
    if "__type__" in payload or "\\u" in payload:
        return False
    try:
        json.loads(payload)
    except ValueError:
        return False
    return True


# --- Publish outbox rows to the broker, each exactly as it was built at call time.

#: Windows between publish attempts of one row (DESIGN.md: 1 s ... 5 min).
PUBLISH_BACKOFF = BackoffPolicy(base=timedelta(seconds=1), cap=timedelta(minutes=5))

#: Which entry point published a message: ``commit`` (the on-commit publisher), ``sweep``
#: (the sweep task or command), ``relay`` (the continuous ``outbox relay`` loop), ``now``
#: (publish-now, :meth:`Relay.publish_ids`), ``eta`` (a worker's retry sent on an ETA).
PublishPath = Literal["commit", "sweep", "relay", "now", "eta"]


@dataclass(frozen=True, kw_only=True)
class PublishReport:
    """What one publish pass did: rows that reached the broker, and rows that did not."""

    published: tuple[int, ...] = ()
    failed: dict[int, str] = field(default_factory=dict)
    #: Those of ``failed`` that are now ``failed`` for good (no more attempts).
    gave_up: frozenset[int] = frozenset()


class Relay:
    """Publishes claimed rows and records the outcome in the store.

    The relay decides which rows to publish (claims, leases born at dispatch, the
    sweeper's check of each row) and what becomes of them (marked published, or
    rescheduled on :data:`PUBLISH_BACKOFF`, or failed);
    :class:`~celery_outbox.publishing.producers.Producers`
    talks to the broker, one connection per thread. Each publish pass waits at most
    about ``outbox_publish_timeout`` in all, whatever the number of rows and the
    transport (:mod:`celery_outbox.publishing.broker`), and never loops on a broker that is down
    or stalled: the rows are already safe in the outbox, and the sweeper tries again
    later. With RabbitMQ, publisher confirms are on: a row is marked only once the
    broker accepted its message.
    """

    def __init__(
        self,
        app: Celery,
        *,
        store: OutboxStore,
        config: OutboxConfig,
        clock: Clock | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.app = app
        self.store = store
        self.config = config
        #: ``None``: each database's own clock (``store.now``), as in production.
        self.clock = clock
        self.rng = rng or random.Random()
        #: The broker side: connections, producers, queues and the publish pass.
        self.producers = Producers(
            app,
            timeout=config.publish_timeout,
            batch_bytes=config.sweep_batch_bytes,
            clock=lambda: (self.clock or utcnow)(),  # ``expires``: the caller's wall time
        )
        self._publishers: dict[str | None, Callable[[Sequence[StoredMessage]], PublishReport]] = {}

    def now(self, using: str | None = None) -> datetime:
        """The clock leases and due times of database ``using`` are on: the database's
        (:meth:`~celery_outbox.store.base.OutboxStore.now`), unless a ``clock`` was given.
        """
        return self.store.now(using=using) if self.clock is None else self.clock()

    def publisher(
        self, using: str | None = None
    ) -> Callable[[Sequence[StoredMessage]], PublishReport]:
        """The on-commit publisher of one database alias: always the same callable, so a
        store can tell that rows deferred with it belong to one batch.
        """
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
            now = self.now(using)
            leased = [m for m in messages if m.locked_until is not None and m.locked_until > now]
            held = self.store.still_leased(leased, using=using) if leased else set()
            mine = tuple(m for m in leased if m.id in held)
            report = PublishReport()
            if mine:
                lease = max(m.locked_until or now for m in mine)
                claim = Claim(messages=mine, lease_until=lease)
                report = self.publish_claim(claim, using=using, path="commit")
            others = [m.id for m in messages if m.locked_until is None or m.locked_until <= now]
            if others:
                report = _merged(
                    report, self._claim_and_publish(others, using=using, path="commit")
                )
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
            return self._claim_and_publish(ids, using=using, validate=validate, path="now")
        except Exception:  # noqa: BLE001 - logged: an on-commit callback never raises
            _log_after_commit_failure(len(ids))
            return PublishReport()

    def _claim_and_publish(
        self, ids: Sequence[int], *, using: str | None, path: PublishPath, validate: bool = False
    ) -> PublishReport:
        # Claim by at most outbox_sweep_batch_bytes of payload at a time, so a long list
        # of large rows is never held in memory at once; each claim takes at least one row.
        report = PublishReport()
        left = list(ids)
        while left:
            now = self.now(using)
            claim = self.store.claim(
                left,
                now=now,
                lease_until=now + self.config.claim_lease,
                max_bytes=self.config.sweep_batch_bytes,
                using=using,
            )
            if not claim.messages:
                break
            published = self.publish_claim(claim, using=using, validate=validate, path=path)
            report = _merged(report, published)
            taken = {m.id for m in claim.messages}
            left = [i for i in left if i not in taken]
            del claim  # before the next claim loads its rows
        return report

    def publish_claim(
        self,
        claim: Claim,
        *,
        using: str | None = None,
        validate: bool = False,
        path: PublishPath = "sweep",
    ) -> PublishReport:
        """Publish every row of ``claim``, then mark or reschedule them (fenced).

        With ``validate`` (the sweeper), rows naming an unregistered task or holding an
        undecodable payload fail at once instead of being published
        (:mod:`celery_outbox.relay.relay`). ``path`` names the entry point (each row's
        publish span says it: :mod:`celery_outbox.tracing`).
        """
        if not claim.messages:
            return PublishReport()
        pending = list(claim.messages)
        fatal = dict[int, str]()
        if validate:
            pending, fatal = sort_out(
                self.app, claim.messages, max_payload_bytes=self.config.max_payload_bytes
            )
        sent = self.producers.send(pending, path=path)
        if sent.published:
            self.store.mark_published(
                claim,
                sent.published,
                now=self.now(using),
                keep=self.config.keep_published > timedelta(0),
                using=using,
            )
            done = set(sent.published)
            rows = [m for m in claim.messages if m.id in done]
            message_published.send(
                sender=self.app, task_ids=[m.task_id for m in rows], messages=rows, path=path
            )
        gave_up = self._record_failures(claim, sent.failed, using=using)
        gave_up |= self._record_fatal(claim, fatal, using=using)
        if sent.failed or fatal:
            failed = {**sent.failed, **fatal}
            message_publish_failed.send(
                sender=self.app,
                task_ids=[m.task_id for m in claim.messages if m.id in failed],
                path=path,
                gave_up=len(gave_up),
            )
        return PublishReport(
            published=tuple(sent.published),
            failed={**sent.failed, **fatal},
            gave_up=frozenset(gave_up),
        )

    def publish_message(self, message: NewMessage) -> None:
        """Publish one message now, bypassing the table (short retry waits).

        Raises whatever the broker raised, within about ``outbox_publish_timeout``; the
        caller parks the message instead.
        """
        self.producers.publish_message(message, path="eta")

    def close(self) -> None:
        """Release this thread's broker connection (each of the broker's goodbyes is
        awaited at most ``outbox_publish_timeout``).
        """
        self.producers.close()

    # -- failures -------------------------------------------------------------------
    def _record_failures(
        self, claim: Claim, failed: dict[int, str], *, using: str | None
    ) -> set[int]:
        """Reschedule rows the broker did not take, one statement per error and attempt
        count; the ids of those the store fails for good (their last attempt).
        """
        attempts = {m.id: m.attempts for m in claim.messages}
        groups: dict[tuple[str, int], list[int]] = defaultdict(list)
        for message_id, error in failed.items():
            groups[(error, attempts[message_id])].append(message_id)
        gave_up: set[int] = set()
        max_attempts = self.config.publish_max_attempts
        for (error, tries), ids in groups.items():
            retry_at: datetime | None = None
            if tries + 1 < max_attempts:  # the one place a row gives up
                retry_at = self.now(using) + PUBLISH_BACKOFF.delay_for(tries + 1, rng=self.rng)
                logger.warning(
                    "celery-outbox: %d row(s) not published (%s); next try at %s",
                    len(ids),
                    error,
                    retry_at.isoformat(),
                )
            else:
                logger.error(
                    "celery-outbox: %d row(s) failed after %d publish attempts: %s",
                    len(ids),
                    max_attempts,
                    error,
                )
                gave_up.update(ids)
            self.store.record_failure(claim, ids, error=error, retry_at=retry_at, using=using)
        return gave_up

    def _record_fatal(self, claim: Claim, fatal: dict[int, str], *, using: str | None) -> set[int]:
        """Fail rows no retry can publish, each with its own error; their ids."""
        for message_id, error in fatal.items():
            logger.error("celery-outbox: row %d failed for good: %s", message_id, error)
            self.store.record_failure(
                claim,
                [message_id],
                error=error,
                retry_at=None,
                using=using,
            )
        return set(fatal)


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


def relay_for(app: Celery) -> Relay:
    """The relay publishing ``app``'s rows through its store (one per app and store)."""
    store = store_for(app)
    state = state_of(app)
    relay = state.relay
    if not isinstance(relay, Relay) or relay.store is not store:
        relay = Relay(app, store=store, config=OutboxConfig.from_celery(app))
        state.relay = relay
    return relay
