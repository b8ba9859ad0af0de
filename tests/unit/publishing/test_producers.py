"""The publish pass (:mod:`celery_outbox.publishing.producers`): rows go out as they were built,
and a broker that takes nothing costs one wait, with each row's reason reported.

Over kombu's in-memory broker and a closed port; real brokers (and a stalled one) are in
``tests/integration``.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import replace
from datetime import timedelta
from typing import Any

import pytest
import redis
from celery import Celery
from kombu import Connection, Producer, Queue

from celery_outbox import OutboxTask
from celery_outbox.publishing.producers import Producers, Sent, describe
from celery_outbox.store.records import NewMessage, StoredMessage
from tests.messages import NOW, numbered, stored
from tests.services import free_port


@pytest.fixture
def app(queue_name: str) -> Iterator[Celery]:
    app = Celery("producers-unit", broker="memory://", set_as_current=False)
    app.conf.task_default_queue = queue_name

    @app.task(base=OutboxTask, name="unit.producers.noop", shared=False)
    def noop(n: int) -> int:
        return n

    yield app
    app.close()


@pytest.fixture
def closed_port() -> int:
    """A loopback port nobody listens on: a broker that is down."""
    return free_port()


def producers(app: Celery, *, batch_bytes: int = 1 << 20, timeout: float = 5.0) -> Producers:
    return Producers(
        app, timeout=timedelta(seconds=timeout), batch_bytes=batch_bytes, clock=lambda: NOW
    )


def message(app: Celery, n: int, **changes: Any) -> NewMessage:
    """The message of ``noop(n)`` with ``changes`` (:func:`tests.messages.numbered`)."""
    return numbered(app.tasks["unit.producers.noop"], n, **changes)


def row(app: Celery, n: int, **changes: Any) -> StoredMessage:
    """:func:`message` as the row of id ``n`` (:func:`tests.messages.stored`)."""
    return stored(app.tasks["unit.producers.noop"], n, **changes)


def drain(queue_name: str) -> list[str]:
    with Connection("memory://") as conn:
        queue = Queue(queue_name)(conn.default_channel)
        ids = []
        while (got := queue.get(no_ack=True)) is not None:
            ids.append(got.headers["id"])
        return ids


def parts_of(sender: Producers, monkeypatch: pytest.MonkeyPatch) -> list[list[int]]:
    """The ids of each part ``sender`` publishes (the real parts, only recorded)."""
    parts: list[list[int]] = []
    send_part = sender._send_part

    def recorded(pending: Sequence[StoredMessage], path: str) -> Sent:
        parts.append([m.id for m in pending])
        return send_part(pending, path)

    monkeypatch.setattr(sender, "_send_part", recorded)
    return parts


def test_a_pass_publishes_every_row_in_parts_of_the_byte_budget(
    app: Celery, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sender = producers(app, batch_bytes=2 * len(row(app, 1).payload))  # two rows per part
    parts = parts_of(sender, monkeypatch)
    try:
        sent = sender.send([row(app, n) for n in (1, 2, 3)], path="sweep")
    finally:
        sender.close()

    assert (sent.published, sent.failed) == ([1, 2, 3], {})
    assert parts == [[1, 2], [3]]
    assert drain(queue_name) == ["task-1", "task-2", "task-3"]


def test_a_pass_stops_at_the_first_part_the_broker_took_nothing_of(
    app: Celery, closed_port: int, monkeypatch: pytest.MonkeyPatch
) -> None:
    app.conf.broker_url = f"amqp://guest:guest@127.0.0.1:{closed_port}//"
    sender = producers(app, batch_bytes=64 * 1024, timeout=0.5)
    parts = parts_of(sender, monkeypatch)
    rows = [row(app, n, payload="x" * 40_000) for n in range(1, 6)]

    sent = sender.send(rows, path="sweep")

    assert parts == [[1, 2]]
    assert sent.published == []
    assert set(sent.failed) == {r.id for r in rows}  # one wait for the lot, not one per part
    assert len(set(sent.failed.values())) == 1


def test_publish_message_raises_what_the_broker_raised(app: Celery, closed_port: int) -> None:
    app.conf.broker_url = f"amqp://guest:guest@127.0.0.1:{closed_port}//"
    sender = producers(app, timeout=0.5)

    with pytest.raises(Exception, match=r"refused|Connection|connect"):
        sender.publish_message(message(app, 1), path="eta")


def test_a_message_ttl_counts_from_its_publish(app: Celery, queue_name: str) -> None:
    # Built with expires 60 s from NOW, published 45 s later: 15 s are left.
    built = message(app, 1)
    options = dict(built.options)
    options["headers"] = {
        **options["headers"],
        "expires": (NOW + timedelta(seconds=60)).isoformat(),
    }
    options["properties"] = {**options.get("properties", {}), "expiration": 60.0}
    later = Producers(
        app,
        timeout=timedelta(seconds=5),
        batch_bytes=1 << 20,
        clock=lambda: NOW + timedelta(seconds=45),
    )
    try:
        later.publish_message(replace(built, options=options), path="eta")
    finally:
        later.close()

    with Connection("memory://") as conn:
        got = Queue(queue_name)(conn.default_channel).get(no_ack=True)
    assert got is not None
    assert float(got.properties["expiration"]) == pytest.approx(15_000)  # kombu: milliseconds


def test_describe_names_the_exception_type_and_keeps_a_row_sized_text() -> None:
    assert describe(ValueError("bad")) == "builtins.ValueError: bad"
    assert len(describe(RuntimeError("x" * 5000))) == 2000


@pytest.fixture
def redis_app(redis_url: str, queue_name: str) -> Iterator[Celery]:
    app = Celery("producers-unit-redis", broker=redis_url, set_as_current=False)
    app.conf.task_default_queue = queue_name

    @app.task(base=OutboxTask, name="unit.producers.noop", shared=False)
    def noop(n: int) -> int:
        return n

    yield app
    with app.connection_for_write() as conn:
        Queue(queue_name)(conn.default_channel).delete()
    app.close()


def redis_ids(app: Celery, queue_name: str) -> list[str]:
    with app.connection_for_write() as conn:
        queue = Queue(queue_name)(conn.default_channel)
        ids = []
        while (got := queue.get(no_ack=True)) is not None:
            ids.append(got.headers["id"])
        return ids


def pipelines_made(sender: Producers, monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """What ``sender``'s channel sends through: ``push`` (RedisPush), ``kombu`` (its batch),
    and ``pipeline`` for each Redis pipeline opened.
    """
    made: list[str] = []
    sender.connect()
    channel = sender._local.producer.channel
    create = channel.create_publish_batch
    push = sender._local.push
    assert push is not None
    pushing = push.pushing
    pipeline = redis.Redis.pipeline

    def batch(max_size: int) -> object:
        made.append("kombu")
        return create(max_size)

    def pushed() -> Any:
        made.append("push")
        return pushing()

    def piped(client: redis.Redis, *args: Any, **kwargs: Any) -> Any:
        made.append("pipeline")
        return pipeline(client, *args, **kwargs)

    monkeypatch.setattr(channel, "create_publish_batch", batch)
    monkeypatch.setattr(push, "pushing", pushed)
    monkeypatch.setattr(redis.Redis, "pipeline", piped)
    return made


#: kombu >= 5.7: its producers pipeline on Redis (older kombu publishes message by message,
#: a failed row waiting for the next pass).
pipelining = pytest.mark.skipif(
    not hasattr(Producer, "batch"), reason="kombu < 5.7: no pipelined publish on Redis"
)


@pipelining
def test_one_row_on_redis_is_pushed_without_a_pipeline(
    redis_app: Celery, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sender = producers(redis_app)
    made = pipelines_made(sender, monkeypatch)
    try:
        assert sender.send([row(redis_app, 1)], path="commit").published == [1]
        assert made[-1] == "push"  # and kombu's declare of the queue (once per channel)
        made.clear()
        assert sender.send([row(redis_app, 6)], path="commit").published == [6]
        assert made == ["push"]  # one LPUSH: no pipeline to set up
        made.clear()
        assert sender.send([row(redis_app, n) for n in (2, 3)], path="commit").published == [2, 3]
        assert made == ["push"]  # several rows of one list: one LPUSH of them all
        elsewhere = [
            replace(row(redis_app, n), options={**row(redis_app, n).options, "exchange": "ex"})
            for n in (4, 5)
        ]
        assert sender.send(elsewhere, path="commit").published == [4, 5]
        # a named exchange (bound to no queue): kombu's batch
        assert made[1:] == ["kombu", "pipeline"]
        one_elsewhere = [elsewhere[0]]
        assert sender.send(one_elsewhere, path="commit").published == [4]
        assert made[3:] == []  # one message through kombu's publish: neither
    finally:
        sender.close()
    assert redis_ids(redis_app, queue_name) == ["task-1", "task-6", "task-2", "task-3"]


@pipelining
def test_one_row_whose_publish_failed_is_tried_once_more_on_a_fresh_connection(
    redis_app: Celery, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    sender = producers(redis_app)
    sender.connect()
    first = sender._local.connection
    publish_one, calls = sender.publish_one, []

    def flaky(producer: object, message: NewMessage, deadline: object, **kwargs: Any) -> None:
        calls.append(message.task_id)
        if len(calls) == 1:
            raise ConnectionResetError("the broker closed an idle connection")
        publish_one(producer, message, deadline, **kwargs)  # type: ignore[arg-type]

    monkeypatch.setattr(sender, "publish_one", flaky)
    try:
        sent = sender.send([row(redis_app, 1)], path="commit")
        assert sender._local.connection is not first
    finally:
        sender.close()
    assert (sent.published, sent.failed) == ([1], {})
    assert calls == ["task-1", "task-1"]
    assert redis_ids(redis_app, queue_name) == ["task-1"]


def test_one_row_whose_publish_timed_out_is_not_tried_again(
    redis_app: Celery, monkeypatch: pytest.MonkeyPatch
) -> None:
    sender = producers(redis_app)
    calls: list[str] = []

    def stalled(producer: object, message: NewMessage, deadline: object, *, path: str) -> None:
        calls.append(message.task_id)
        raise TimeoutError("the broker stalls")

    monkeypatch.setattr(sender, "publish_one", stalled)
    try:
        sent = sender.send([row(redis_app, 1)], path="commit")
    finally:
        sender.close()
    assert sent.published == []
    assert list(sent.failed) == [1]
    assert calls == ["task-1"]
