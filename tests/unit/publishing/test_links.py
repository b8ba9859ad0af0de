"""Each thread's link to the broker (:mod:`celery_outbox.publishing.links`): one connection per
thread, kept while it lives, reopened once lost, dropped after a failure; its producer's
queues bound once per channel, and what the transport can do at once.

Over kombu's in-memory broker, real Redis and real RabbitMQ.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from datetime import timedelta

import pytest
from celery import Celery
from kombu import Producer

from celery_outbox.publishing.broker import Confirms, Deadline
from celery_outbox.publishing.links import BrokerLinks


def deadline() -> Deadline:
    return Deadline.after(timedelta(seconds=5))


@pytest.fixture
def app(queue_name: str) -> Iterator[Celery]:
    app = Celery("broker-links-unit", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = queue_name
    yield app
    app.close()


def test_a_thread_keeps_its_connection_and_each_thread_has_its_own(app: Celery) -> None:
    links = BrokerLinks(app)
    producer = links.open(deadline())
    assert links.open(deadline()) is producer
    assert links.connection is not None

    seen: list[object] = []
    thread = threading.Thread(target=lambda: seen.append(links.open(deadline())))
    thread.start()
    thread.join()
    assert seen[0] is not producer
    assert links.open(deadline()) is producer
    links.close(deadline())
    assert links.connection is None


def test_a_lost_connection_is_reopened_and_a_discarded_one_forgotten(app: Celery) -> None:
    links = BrokerLinks(app)
    first = links.open(deadline())
    assert links.connection is not None
    links.connection.collect()  # lost: no longer connected
    second = links.open(deadline())
    assert second is not first
    links.discard()
    assert links.connection is None
    assert links.open(deadline()) is not second
    links.close(deadline())


def test_queues_are_bound_once_per_channel(app: Celery, queue_name: str) -> None:
    links = BrokerLinks(app)
    producer = links.open(deadline())
    [queue] = links.queues(producer, [queue_name])
    assert queue.channel is producer.channel
    assert links.queues(producer, [queue_name])[0] is queue
    links.discard()
    again = links.open(deadline())
    assert links.queues(again, [queue_name])[0] is not queue  # a new channel: bound anew
    links.close(deadline())


def test_what_each_transport_does_at_once(app: Celery, redis_url: str, amqp_url: str) -> None:
    memory = BrokerLinks(app)
    memory.open(deadline())
    assert (memory.pipelines, memory.confirms, memory.push) == (False, None, None)
    memory.close(deadline())

    redis_pipelines = hasattr(Producer, "batch")  # kombu >= 5.7
    for url, pipelines, confirms in (
        (redis_url, redis_pipelines, False),
        (amqp_url, False, True),
    ):
        other = Celery("broker-links-transports", broker=url, set_as_current=False)
        links = BrokerLinks(other)
        producer = links.open(deadline())
        try:
            assert links.pipelines is pipelines, url
            assert (links.push is not None) is pipelines, url  # Redis: parts pushed at once
            assert isinstance(links.confirms, Confirms) is confirms, url
            if confirms:
                assert links.confirms is not None
                assert links.confirms.channel is producer.channel
        finally:
            links.close(deadline())
            other.close()
