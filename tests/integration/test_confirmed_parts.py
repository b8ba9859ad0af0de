"""On RabbitMQ a part of rows goes out with one wait for its publisher confirms.

Over the real RabbitMQ, through the real py-amqp channel, instrumented only to record the
order of what it does: every message of a part is written before the first read of a
confirm, and py-amqp's own wait after each publish (``basic_publish_confirm``) never runs.
A row is published only when the broker acked its message: a queue that refuses
(``x-overflow: reject-publish``) nacks for real, and those rows fail. A broker that stops
answering (:class:`~tests.stall_proxy.StallProxy`) costs one ``outbox_publish_timeout``
and publishes nothing; a connection cut during the wait sends the rows again one by one.
A broker killed during the wait is in ``tests/reliability/test_rabbitmq_confirms.py``.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from kombu import Connection, Exchange, Queue

from celery_outbox import OutboxTask
from celery_outbox.publishing.broker import Confirms
from celery_outbox.publishing.producers import Producers
from celery_outbox.store.records import StoredMessage
from tests.brokers import delete_queue
from tests.messages import NOW, stored
from tests.stall_proxy import StallProxy

TASK = "integration.confirmed_parts.noop"
#: What py-amqp writes for a basic.publish method (class 60, method 40).
PUBLISH_BYTES = b"\x00\x3c\x00\x28"
#: Rows of a part.
ROWS = 50


def make_app(broker_url: str, queue: Queue) -> Celery:
    app = Celery("confirmed-parts", broker=broker_url, set_as_current=False)
    app.conf.task_queues = [queue]
    app.conf.task_default_queue = queue.name

    @app.task(base=OutboxTask, name=TASK, shared=False)
    def noop(n: int) -> int:
        return n

    return app


@pytest.fixture
def app(amqp_url: str, queue_name: str) -> Iterator[Celery]:
    app = make_app(amqp_url, Queue(queue_name, Exchange(queue_name), routing_key=queue_name))
    yield app
    app.close()
    delete_queue(amqp_url, queue_name)


def row(app: Celery, n: int) -> StoredMessage:
    """The row of ``noop(n)``, id ``n`` (:func:`tests.messages.stored`)."""
    return stored(app.tasks[TASK], n)


def producers(app: Celery, *, timeout: float = 5.0) -> Producers:
    return Producers(
        app, timeout=timedelta(seconds=timeout), batch_bytes=1 << 24, clock=lambda: NOW
    )


def queued(amqp_url: str, name: str) -> list[str]:
    """The task ids waiting in queue ``name``, taken off it."""
    with Connection(amqp_url) as conn:
        channel = conn.default_channel
        ids = []
        while (message := channel.basic_get(name, no_ack=True)) is not None:
            ids.append(message.headers["id"])
        return ids


def record(channel: Any, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What ``channel`` does from now on, in order: ``publish`` (a basic.publish written),
    ``read`` (a frame awaited from the broker), ``wait`` (py-amqp's wait for one reply).

    A read that does not wait (``timeout=0``: py-amqp looks for a ``connection.blocked``
    before each publish) is ``poll``.
    """
    events: list[str] = []

    def recorded(name: str, call: Any) -> Any:
        def run(*args: Any, **kwargs: Any) -> Any:
            events.append("poll" if name == "read" and kwargs.get("timeout") == 0 else name)
            return call(*args, **kwargs)

        return run

    monkeypatch.setattr(channel, "_basic_publish", recorded("publish", channel._basic_publish))
    monkeypatch.setattr(channel, "wait", recorded("wait", channel.wait))
    connection = channel.connection
    monkeypatch.setattr(connection, "drain_events", recorded("read", connection.drain_events))
    return events


def test_a_part_is_written_whole_then_confirmed_with_one_wait(
    app: Celery, amqp_url: str, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sender = producers(app)
    try:
        assert sender.send([row(app, 0)], path="sweep").published == [0]  # declares the queue
        channel = sender._local.producer.channel
        events = record(channel, monkeypatch)

        sent = sender.send([row(app, n) for n in range(1, ROWS + 1)], path="sweep")

        assert (sent.published, sent.failed) == (list(range(1, ROWS + 1)), {})
        assert sender._local.producer.channel is channel  # no reconnect, no fall-back
        publishes = [i for i, event in enumerate(events) if event == "publish"]
        assert len(publishes) == ROWS
        assert "wait" not in events  # py-amqp never waited for one message's confirm
        assert events.index("read") > publishes[-1]  # every message out before one read
        assert events.count("read") <= ROWS  # RabbitMQ confirms one or many per frame

        events.clear()
        sender.batch_publish = False  # message by message: a wait after each publish
        assert sender.send([row(app, n) for n in (101, 102, 103)], path="sweep").published == [
            101,
            102,
            103,
        ]
        assert [e for e in events if e in ("publish", "wait")] == ["publish", "wait"] * 3
    finally:
        sender.close()
    assert queued(amqp_url, queue_name) == [f"task-{n}" for n in (*range(ROWS + 1), 101, 102, 103)]


@pytest.fixture
def full_queue_app(amqp_url: str, queue_name: str) -> Iterator[Celery]:
    """An app whose queue holds 3 messages and nacks any more (RabbitMQ's reject-publish)."""
    arguments = {"x-max-length": 3, "x-overflow": "reject-publish"}
    queue = Queue(
        queue_name, Exchange(queue_name), routing_key=queue_name, queue_arguments=arguments
    )
    app = make_app(amqp_url, queue)
    yield app
    app.close()
    with Connection(amqp_url) as conn:
        conn.default_channel.queue_delete(queue_name)
        conn.default_channel.exchange_delete(queue_name)


def test_rows_whose_messages_the_broker_nacked_fail_and_the_others_are_published(
    full_queue_app: Celery, amqp_url: str, queue_name: str
) -> None:
    app = full_queue_app
    sender = producers(app)
    try:
        sent = sender.send([row(app, n) for n in range(1, 7)], path="sweep")
        assert sent.published == [1, 2, 3]
        assert sent.failed == dict.fromkeys((4, 5, 6), Confirms.NACKED)
        # The channel is still usable: the next part waits for its own confirms only.
        assert queued(amqp_url, queue_name) == ["task-1", "task-2", "task-3"]
        sent = sender.send([row(app, n) for n in range(7, 12)], path="sweep")
        assert (sent.published, sorted(sent.failed)) == ([7, 8, 9], [10, 11])
    finally:
        sender.close()
    assert queued(amqp_url, queue_name) == ["task-7", "task-8", "task-9"]


@pytest.fixture
def proxy(amqp_url: str) -> Iterator[StallProxy]:
    stall_proxy = StallProxy.for_url(amqp_url)
    yield stall_proxy
    stall_proxy.close()


def test_a_broker_that_stops_confirming_costs_one_timeout_and_publishes_nothing(
    amqp_url: str, queue_name: str, proxy: StallProxy
) -> None:
    queue = Queue(queue_name, Exchange(queue_name), routing_key=queue_name)
    app = make_app(proxy.url(amqp_url), queue)
    sender = producers(app, timeout=0.5)
    try:
        assert sender.send([row(app, 0)], path="sweep").published == [0]
        proxy.stall(when=PUBLISH_BYTES)  # the broker gets no more messages, sends nothing

        started = time.monotonic()
        sent = sender.send([row(app, n) for n in range(1, ROWS + 1)], path="sweep")
        took = time.monotonic() - started

        assert sent.published == []
        assert sorted(sent.failed) == list(range(1, ROWS + 1))
        assert all("imeout" in error or "timed out" in error for error in sent.failed.values())
        assert took < 0.5 + 1.0, f"waited {took:.2f} s with outbox_publish_timeout 0.5 s"
        proxy.resume()
        assert sender.send([row(app, ROWS + 1)], path="sweep").published == [ROWS + 1]
        assert queued(amqp_url, queue_name) == ["task-0", f"task-{ROWS + 1}"]
    finally:
        sender.close()
        app.close()
        delete_queue(amqp_url, queue_name)


def test_a_connection_cut_while_waiting_sends_the_rows_again_one_by_one(
    amqp_url: str, queue_name: str, proxy: StallProxy
) -> None:
    queue = Queue(queue_name, Exchange(queue_name), routing_key=queue_name)
    app = make_app(proxy.url(amqp_url), queue)
    sender = producers(app, timeout=5.0)
    cut = threading.Timer(0.3, proxy.resume)  # cuts the stalled connection
    try:
        assert sender.send([row(app, 0)], path="sweep").published == [0]
        proxy.stall(when=PUBLISH_BYTES)
        cut.start()
        started = time.monotonic()
        sent = sender.send([row(app, n) for n in range(1, ROWS + 1)], path="sweep")
        took = time.monotonic() - started

        assert (sent.published, sent.failed) == (list(range(1, ROWS + 1)), {})
        assert took < 5.0  # the cut ended the wait, not the timeout
        # What the stalled connection carried never reached the broker: each row once.
        assert queued(amqp_url, queue_name) == [f"task-{n}" for n in range(ROWS + 1)]
    finally:
        cut.cancel()
        sender.close()
        app.close()
        delete_queue(amqp_url, queue_name)
