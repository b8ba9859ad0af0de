"""One stored message handed to the broker (:mod:`celery_outbox.publishing.producers`): its body
and properties as stored, its TTL counted from the publish. Over kombu's in-memory broker;
the Redis push is pinned against kombu in ``test_redis_push.py``.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace
from datetime import timedelta

import pytest
from celery import Celery
from kombu import Connection, Queue

from celery_outbox import OutboxTask
from celery_outbox.dispatch.envelope import publish_headers
from celery_outbox.publishing.broker import Deadline
from celery_outbox.publishing.links import BrokerLinks
from celery_outbox.publishing.producers import MessageSends
from tests.messages import NOW, numbered


@pytest.fixture
def app(queue_name: str) -> Iterator[Celery]:
    app = Celery("message-sends-unit", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = queue_name

    @app.task(base=OutboxTask, name="unit.message_sends.noop", shared=False)
    def noop(n: int) -> int:
        return n

    yield app
    app.close()


def test_properties_are_the_stored_ones_with_the_ttl_left_at_the_publish(app: Celery) -> None:
    sends = MessageSends(BrokerLinks(app), clock=lambda: NOW + timedelta(seconds=45))
    expires = (NOW + timedelta(seconds=60)).isoformat()
    options = {"properties": {"expiration": 60.0, "correlation_id": "c"}}
    assert sends.properties(options, {"expires": expires}) == {
        "expiration": 15.0,
        "correlation_id": "c",
    }
    assert options["properties"]["expiration"] == 60.0  # the row's own stay as stored
    late = MessageSends(BrokerLinks(app), clock=lambda: NOW + timedelta(seconds=90))
    assert late.properties(options, {"expires": expires})["expiration"] == 0.0
    assert sends.properties(options, {})["expiration"] == 60.0  # no expiry header: as stored


def test_through_kombu_publishes_the_stored_body_and_headers(app: Celery, queue_name: str) -> None:
    links = BrokerLinks(app)
    deadline = Deadline.after(timedelta(seconds=5))
    producer = links.open(deadline)
    built = numbered(app.tasks["unit.message_sends.noop"], 7)
    built = replace(built, options={**built.options, "properties": {"priority": 3}})
    MessageSends(links, clock=lambda: NOW).through_kombu(
        producer, built, publish_headers(built.options), deadline
    )
    links.close(deadline)
    with Connection("memory://") as conn:
        got = Queue(queue_name)(conn.default_channel).get(no_ack=True)
    assert got is not None
    assert got.body == built.payload.encode()
    assert got.headers["id"] == "task-7"
    assert got.properties["priority"] == 3
