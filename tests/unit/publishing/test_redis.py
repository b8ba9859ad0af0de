"""The kombu Redis internals that redis_push.py leans on: a stored message pushed by
:class:`RedisPush` lands on a real Redis as the very JSON kombu's own publish writes, under
the same key, and a kombu consumer takes and acknowledges it.

This is the upgrade alarm: if kombu changes its Redis message layout, its priority keys or
its queue expiries, the first test says which message differs, and how.
"""

from __future__ import annotations

import json
import os
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Connection, Producer, Queue

from celery_outbox import OutboxTask
from celery_outbox.dispatch.envelope import build_message, publish_headers
from celery_outbox.publishing.broker import Deadline, PublishDeadlineError
from celery_outbox.publishing.links import BrokerLinks
from celery_outbox.publishing.producers import MessageSends
from celery_outbox.publishing.redis import RedisPush
from celery_outbox.state import reset
from celery_outbox.store.records import NewMessage
from tests.messages import NOW, PARK_AFTER

TASK = "unit.redis_push.noop"

pytestmark = pytest.mark.skipif(
    not hasattr(Producer, "batch"),
    reason="RedisPush serves the producers that pipeline (kombu >= 5.7); older kombu "
    "publishes message by message through kombu",
)


@pytest.fixture
def app(redis_url: str, queue_name: str) -> Iterator[Celery]:
    app = Celery("redis-push", broker=redis_url, set_as_current=False)
    app.conf.task_default_queue = queue_name

    @app.task(base=OutboxTask, name=TASK, shared=False)
    def noop(*args: Any, **kwargs: Any) -> None:
        pass

    yield app
    reset(app)
    app.close()


@pytest.fixture
def client(redis_url: str, queue_name: str) -> Iterator[redis.Redis]:
    client = redis.Redis.from_url(redis_url)
    yield client
    client.delete(*client.keys(f"{queue_name}*") or [queue_name])
    client.close()


def message(app: Celery, **options: Any) -> NewMessage:
    return build_message(
        app.tasks[TASK],
        (1, "é"),
        {"k": [1.5, None]},
        task_id=str(uuid.uuid4()),
        options=options,
        now=NOW,
        park_after=PARK_AFTER,
        max_bytes=None,
    )


def deadline() -> Deadline:
    return Deadline.after(timedelta(seconds=5))


def opened(app: Celery) -> tuple[BrokerLinks, Producer, RedisPush]:
    """``app``'s broker links, their open producer and its push."""
    links = BrokerLinks(app)
    producer = links.open(deadline())
    push = RedisPush.of(producer)
    assert push is not None
    return links, producer, push


def pushed_raw(client: redis.Redis, queue: str) -> dict[bytes, list[bytes]]:
    """Every list of ``queue`` (its priority lists too), emptied: key -> raw messages."""
    found = {key: client.lrange(key, 0, -1) for key in client.keys(f"{queue}*")}
    if found:
        client.delete(*found)
    return found


def without_tags(raw: dict[bytes, list[bytes]]) -> dict[bytes, list[Any]]:
    decoded = {key: [json.loads(m) for m in messages] for key, messages in raw.items()}
    for messages in decoded.values():
        for m in messages:
            m["properties"].pop("delivery_tag")
    return decoded


#: Messages as Celery builds them, each with options a sweep meets.
CASES: dict[str, dict[str, Any]] = {
    "plain": {},
    "priority": {"priority": 7},
    "expires": {"expires": 600},
    "countdown": {"countdown": 5},
    "headers": {"headers": {"tenant": "a"}, "correlation_id": "c-1"},
    "compressed": {"compression": "zlib"},
    "transient": {"delivery_mode": 1},
}


@pytest.mark.parametrize("case", CASES)
def test_a_pushed_message_is_the_json_kombu_publishes_under_the_same_key(
    app: Celery, client: redis.Redis, queue_name: str, case: str
) -> None:
    built = message(app, **CASES[case])
    links = BrokerLinks(app)
    producer = links.open(deadline())
    sends = MessageSends(links, clock=lambda: NOW)
    push = RedisPush.of(producer)
    assert push is not None
    assert push.takes(built.options)
    try:
        sends.through_kombu(producer, built, publish_headers(built.options), deadline())
        by_kombu = pushed_raw(client, queue_name)
        with push.pushing():
            sends.into(push, deadline())(
                producer, built, publish_headers(built.options), deadline()
            )
        by_push = pushed_raw(client, queue_name)
    finally:
        links.close(deadline())
    assert list(by_push) == list(by_kombu), f"{case}: kombu keys its list otherwise now"
    assert without_tags(by_push) == without_tags(by_kombu), (
        f"{case}: kombu's Redis message differs from RedisPush's (kombu changed its layout)"
    )


def test_a_part_lands_on_the_lists_kombu_publishes_it_to_in_the_same_order(
    app: Celery, client: redis.Redis, queue_name: str
) -> None:
    # One LPUSH per list for the whole part: the lists end as kombu's one LPUSH per message.
    part = [message(app, priority=[0, 7, 3][n % 3]) for n in range(12)]
    links = BrokerLinks(app)
    producer = links.open(deadline())
    sends, push = MessageSends(links, clock=lambda: NOW), RedisPush.of(producer)
    assert push is not None
    try:
        for m in part:
            sends.through_kombu(producer, m, publish_headers(m.options), deadline())
        by_kombu = pushed_raw(client, queue_name)
        with push.pushing():
            for m in part:
                sends.into(push, deadline())(producer, m, publish_headers(m.options), deadline())
        by_push = pushed_raw(client, queue_name)
    finally:
        links.close(deadline())
    assert len(by_push) == 3  # a list per priority step
    assert sorted(by_push) == sorted(by_kombu)
    assert without_tags(by_push) == without_tags(by_kombu)


def test_delivery_tags_are_unique_version_4_uuids_per_push(app: Celery, queue_name: str) -> None:
    tags = set()
    for _ in range(2):  # two channels: two random prefixes
        links = BrokerLinks(app)
        push = RedisPush.of(links.open(deadline()))
        assert push is not None
        tags |= {push._tag() for _ in range(1000)}
        links.close(deadline())
    assert len(tags) == 2000
    assert {uuid.UUID(tag).version for tag in tags} == {4}


def test_a_forked_process_draws_delivery_tags_of_its_own(app: Celery) -> None:
    links = BrokerLinks(app)
    push = RedisPush.of(links.open(deadline()))
    assert push is not None
    parent = {push._tag() for _ in range(3)}
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: the same object, counting on from where the parent was
        os.write(write, json.dumps([push._tag() for _ in range(3)]).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read) as pipe:
        child = set(json.loads(pipe.read()))
    os.waitpid(pid, 0)
    links.close(deadline())
    assert len(child) == 3
    assert not child & (parent | {push._tag() for _ in range(3)})
    assert {tag[:24] for tag in child}.isdisjoint(tag[:24] for tag in parent)


def test_a_pushed_part_is_consumed_and_acknowledged_by_kombu(
    app: Celery, redis_url: str, client: redis.Redis, queue_name: str
) -> None:
    links = BrokerLinks(app)
    producer = links.open(deadline())
    sends, push = MessageSends(links, clock=lambda: NOW), RedisPush.of(producer)
    assert push is not None
    built = [message(app) for _ in range(3)]
    with push.pushing():
        for m in built:
            sends.into(push, deadline())(producer, m, publish_headers(m.options), deadline())
        assert client.llen(queue_name) == 0  # nothing before the block ends
    links.close(deadline())
    with Connection(redis_url) as conn:
        bound = Queue(queue_name)(conn.default_channel)
        got = [bound.get() for _ in built]
        assert [m.headers["id"] for m in got if m is not None] == [m.task_id for m in built]
        for m in got:
            assert m is not None
            assert m.decode() == [[1, "é"], {"k": [1.5, None]}, m.decode()[2]]
            m.ack()
        assert bound.get() is None
    assert client.hlen("unacked") == 0 or all(
        m is not None and client.hget("unacked", m.delivery_tag) is None for m in got
    )


def test_a_part_raising_in_its_block_pushes_nothing(
    app: Celery, client: redis.Redis, queue_name: str
) -> None:
    links, producer, push = opened(app)
    built = message(app)
    send = MessageSends(links, lambda: NOW).into(push, deadline())

    def failing_part() -> None:
        with push.pushing():
            send(producer, built, publish_headers(built.options), deadline())
            raise RuntimeError("a later message failed to build")

    with pytest.raises(RuntimeError):
        failing_part()
    with push.pushing():
        pass  # nothing left over from the failed block
    links.close(deadline())
    assert client.llen(queue_name) == 0


def test_a_queue_with_an_expiry_gets_kombus_expiry_on_each_priority_list(
    app: Celery, client: redis.Redis, queue_name: str
) -> None:
    app.conf.task_queues = [Queue(queue_name, expires=60)]
    links, producer, push = opened(app)
    built = message(app)
    links.declare(producer, [queue_name])  # kombu learns the expiry when it declares
    with push.pushing():
        MessageSends(links, lambda: NOW).into(push, deadline())(
            producer, built, publish_headers(built.options), deadline()
        )
    links.close(deadline())
    assert 0 < client.pttl(queue_name) <= 60_000


def test_other_exchanges_and_publish_arguments_stay_with_kombu(app: Celery) -> None:
    links = BrokerLinks(app)
    push = RedisPush.of(links.open(deadline()))
    assert push is not None
    assert push.takes({"exchange": "", "properties": {"priority": 3, "expiration": 1.0}})
    assert not push.takes({"exchange": "topic-x", "properties": {}})
    assert not push.takes({"exchange": "", "properties": {"mandatory": True}})
    links.close(deadline())


def test_only_kombus_redis_transport_gets_a_push(amqp_url: str) -> None:
    for url in ("memory://", amqp_url):
        with Connection(url) as conn:
            assert RedisPush.of(conn.Producer()) is None, url


def test_a_part_past_its_deadline_is_refused_before_any_message_is_added(
    app: Celery, client: redis.Redis, queue_name: str
) -> None:
    links, _, push = opened(app)
    try:
        with pytest.raises(PublishDeadlineError), push.pushing():
            MessageSends(links, lambda: NOW).into(push, Deadline.after(timedelta(0)))
    finally:
        links.close(deadline())
    assert client.llen(queue_name) == 0
