"""The publish deadline, and the kombu / py-amqp / redis-py internals that broker.py leans on.

The second half is the upgrade alarm: if one of these names moves, a socket wait of the relay
is no longer bounded (a stalled broker hangs the commit) and these tests say which one.
"""

from __future__ import annotations

import inspect
import uuid
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import amqp
import pytest
from celery import Celery
from kombu import Connection, Queue
from kombu.transport import pyamqp

from celery_outbox.publishing import broker
from celery_outbox.publishing.broker import Deadline, PublishDeadlineError


class FakeClock:
    """A monotonic clock the test moves by hand."""

    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_a_deadline_counts_down_and_refuses_once_spent() -> None:
    clock = FakeClock()
    deadline = Deadline.after(timedelta(seconds=1.5), clock=clock)

    assert deadline.check() == 1.5
    clock.now += 1.0
    assert deadline.remaining() == pytest.approx(0.5)
    clock.now += 0.7
    assert deadline.remaining() == 0.0
    with pytest.raises(PublishDeadlineError, match=r"1\.5 s \(outbox_publish_timeout\)"):
        deadline.check()


def test_a_deadline_starts_again_when_the_broker_accepts_a_message() -> None:
    clock = FakeClock()
    deadline = Deadline.after(timedelta(seconds=1), clock=clock)
    for _ in range(5):  # a long pass to a broker that keeps answering is never cut
        clock.now += 0.9
        assert deadline.check() == pytest.approx(0.1)
        deadline.progressed()
    assert deadline.remaining() == 1.0


def test_a_spent_deadline_opens_no_connection() -> None:
    clock = FakeClock()
    deadline = Deadline.after(timedelta(seconds=1), clock=clock)
    clock.now += 1

    app = Celery("broker-unit", broker="memory://", set_as_current=False)
    with pytest.raises(PublishDeadlineError):
        broker.connect(app, deadline)


def test_socket_bounds_use_each_transports_own_names() -> None:
    assert broker.socket_bounds("py-amqp", 0.5) == {"read_timeout": 0.5, "write_timeout": 0.5}
    assert broker.socket_bounds("redis", 0.5) == {
        "socket_timeout": 0.5,
        "socket_connect_timeout": 0.5,
    }
    assert broker.socket_bounds("memory", 0.5) == {}


def test_timeouts_are_recognised_through_kombus_wrapping() -> None:
    pytest.importorskip("redis")
    from kombu.exceptions import OperationalError
    from redis.exceptions import ConnectionError as RedisConnectionError
    from redis.exceptions import TimeoutError as RedisTimeoutError

    def wrapped(cause: BaseException) -> OperationalError:
        try:
            raise OperationalError(str(cause)) from cause
        except OperationalError as exc:
            return exc

    assert broker.timed_out(wrapped(RedisTimeoutError("Timeout reading from socket")))
    assert broker.timed_out(wrapped(TimeoutError("timed out")))  # py-amqp's socket.timeout
    assert broker.timed_out(PublishDeadlineError("spent"))
    assert not broker.timed_out(wrapped(RedisConnectionError("refused")))
    assert not broker.timed_out(ValueError("bad"))


# -- the internals (upgrade alarm) -----------------------------------------------------------


def test_kombu_names_its_transports_as_broker_py_expects() -> None:
    assert pyamqp.Transport.driver_name == broker.PY_AMQP
    assert Connection("amqp://").transport.driver_name == broker.PY_AMQP
    pytest.importorskip("redis")
    assert Connection("redis://").transport.driver_name == broker.REDIS


def test_py_amqp_bounds_reads_and_writes_by_these_names_and_ignores_others() -> None:
    # kombu passes transport options to amqp.Connection as keywords; **kwargs swallows the
    # names it does not know (socket_timeout was silently ignored that way).
    params = inspect.signature(amqp.Connection.__init__).parameters
    assert {"read_timeout", "write_timeout", "connect_timeout", "confirm_publish"} <= set(params)
    assert "socket_timeout" not in params
    assert isinstance(inspect.getattr_static(amqp.Connection, "sock"), property)


def test_kombus_redis_channel_reads_these_socket_options() -> None:
    pytest.importorskip("redis")
    from kombu.transport import redis as kombu_redis

    options = kombu_redis.Channel.from_transport_options
    assert {"socket_timeout", "socket_connect_timeout"} <= set(options)


def test_redis_timeouts_are_named_timeout_error() -> None:
    pytest.importorskip("redis")
    from redis.exceptions import TimeoutError as RedisTimeoutError

    assert RedisTimeoutError.__name__ == "TimeoutError"


def test_kombu_can_drop_a_connection_without_a_close_handshake() -> None:
    # collect() closes the sockets only; py-amqp's transport implements it as _collect.
    assert callable(Connection.collect)
    assert callable(pyamqp.Transport._collect)
    assert callable(amqp.Connection.collect)


def test_kombus_redis_channel_still_builds_a_client_per_publish_through_create_client(
    redis_url: str,
) -> None:
    with Connection(redis_url) as conn:
        channel = conn.default_channel
        assert channel.connection.driver_name == broker.REDIS
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is not second, "kombu's Redis channel now reuses its clients"
        broker.reuse_client(channel)
        with channel.conn_or_acquire() as first, channel.conn_or_acquire() as second:
            assert first is second, (
                "kombu's Redis channel no longer builds its clients with _create_client()"
            )
            assert first.connection_pool is channel.pool
        channel._pool = None  # a new pool (kombu drops it on disconnect): a new client
        with channel.conn_or_acquire() as third:
            assert third is not first
            assert third.connection_pool is channel.pool


def test_a_redis_channel_publishes_and_reads_through_its_one_client(redis_url: str) -> None:
    from kombu import Exchange, Queue

    queue = Queue(f"celery-outbox-reuse-{id(object())}", Exchange(""), routing_key="")
    with Connection(redis_url) as conn:
        channel = conn.channel()
        broker.reuse_client(channel)
        producer = conn.Producer(channel)
        bound = queue(channel)
        bound.declare()
        try:
            for n in range(3):
                producer.publish({"n": n}, routing_key=queue.name, retry=False)
            assert [bound.get(no_ack=True).payload["n"] for _ in range(3)] == [0, 1, 2]
        finally:
            bound.delete()
            channel.close()


def test_other_transports_keep_their_own_clients() -> None:
    with Connection("memory://") as conn:
        channel = conn.default_channel
        create = channel.__dict__.get("_create_client")
        broker.reuse_client(channel)
        assert channel.__dict__.get("_create_client") is create


# -- publisher confirms on RabbitMQ (Confirms) -----------------------------------------------


def test_py_amqp_waits_for_each_confirm_through_these_names() -> None:
    # Confirms counts publishes by wrapping the instance's _basic_publish and confirm_select:
    # basic_publish_confirm must still reach them through self, and select confirms once.
    source = inspect.getsource(amqp.Channel.basic_publish_confirm)
    assert "self._confirm_selected" in source
    assert "self.confirm_select()" in source
    assert "self._basic_publish(" in source
    assert callable(amqp.Channel._basic_publish)
    assert {"timeout", "confirm_timeout"} <= set(
        inspect.signature(amqp.Channel._basic_publish).parameters
    )
    assert "timeout" in inspect.signature(amqp.Connection.drain_events).parameters
    # A nack reaches the same callbacks as an ack, with the tag and the multiple flag.
    for event, handler in (("basic_ack", "_on_basic_ack"), ("basic_nack", "_on_basic_nack")):
        handled = inspect.getsource(getattr(amqp.Channel, handler))
        assert f"self.events['{event}']" in handled
        assert "callback(delivery_tag, multiple)" in handled


def test_a_nacked_rows_error_names_py_amqps_exception() -> None:
    nacked = amqp.exceptions.MessageNacked
    assert broker.Confirms.NACKED.startswith(f"{nacked.__module__}.{nacked.__qualname__}: ")


@pytest.fixture
def amqp_channel(amqp_url: str) -> Iterator[tuple[Any, Queue]]:
    """A py-amqp channel asking for publisher confirms (as connect()'s), and a queue."""
    conn = Connection(amqp_url, transport_options={"confirm_publish": True})
    queue = Queue(f"celery-outbox-confirms-{uuid.uuid4()}", routing_key="")
    channel = conn.channel()
    bound = queue(channel)
    bound.declare()
    try:
        yield channel, bound
    finally:
        bound.delete()
        conn.close()


def publish(channel: Any, queue: Queue, body: str) -> None:
    channel.basic_publish(amqp.Message(body), exchange="", routing_key=queue.name)


def test_confirms_counts_every_publish_of_its_channel_single_ones_too(
    amqp_channel: tuple[Any, Queue],
) -> None:
    channel, queue = amqp_channel
    confirms = broker.confirms(channel)
    assert confirms is not None
    publish(channel, queue, "single 1")  # basic_publish_confirm: selects, waits for its ack
    publish(channel, queue, "single 2")
    assert confirms.last_tag == 2
    deadline = Deadline.after(timedelta(seconds=5))
    for round_ in range(2):
        with confirms.unawaited():
            for n in range(3):
                publish(channel, queue, f"batch {round_}-{n}")
        assert confirms.wait(deadline) == [True, True, True]
        assert confirms.outcomes() == []  # waited for: nothing left to tell
        publish(channel, queue, f"single after {round_}")
    assert confirms.last_tag == 2 + 2 * 4
    assert queue.queue_declare(passive=True).message_count == 10


def test_confirms_settles_tags_one_by_one_and_up_to_a_tag_and_keeps_the_first_outcome(
    amqp_channel: tuple[Any, Queue],
) -> None:
    channel, queue = amqp_channel
    # py-amqp reads what the broker sent before each publish when the connection
    # advertises ``connection.blocked``: it would read the broker's own acks of the first
    # tags while the part goes out (as CI under load did), before the frames below. Off
    # for this connection (its own dict: the default one is shared), they stay unread.
    properties = channel.connection.client_properties
    properties["capabilities"] = {**properties["capabilities"], "connection.blocked": False}
    confirms = broker.confirms(channel)
    assert confirms is not None
    publish(channel, queue, "before")  # tag 1
    with confirms.unawaited():
        for n in range(4):  # tags 2..5
            publish(channel, queue, f"batch {n}")
    # What py-amqp calls for each Basic.Nack / Basic.Ack frame it reads (the broker's own
    # acks of these tags are still unread on the socket).
    channel._on_basic_nack(3, False)
    assert confirms.outcomes() == [None, False, None, None]
    channel._on_basic_ack(4, True)  # 1..4: tag 3 stays nacked
    assert confirms.outcomes() == [True, False, True, None]
    channel._on_basic_ack(9, False)  # not one of them
    # The broker's own acks settle tag 5.
    assert confirms.wait(Deadline.after(timedelta(seconds=5))) == [True, False, True, True]


def test_other_transports_have_no_confirms_to_track(redis_url: str) -> None:
    with Connection("memory://") as conn:
        assert broker.confirms(conn.default_channel) is None
    with Connection(redis_url) as conn:
        assert broker.confirms(conn.default_channel) is None
