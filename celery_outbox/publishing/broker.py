"""Broker connections whose every wait ends by one deadline: one bounded wait per publish.

A broker can accept a connection and then stop answering (a frozen process, a RabbitMQ
resource alarm, Redis ``CLIENT PAUSE``). A publish pass therefore runs against a
:class:`Deadline` of ``outbox_publish_timeout``: a connection is opened with the time left,
its socket waits are bounded per transport, no step starts once the time is spent, a
timeout ends the pass, and a connection that failed is dropped without talking to the
broker again.

This module is the one place that leans on kombu's and py-amqp's internals (transport
option names, the py-amqp socket, the publisher confirms of a py-amqp channel:
:class:`Confirms`); ``tests/unit/publishing/test_broker.py`` fails loudly when an upgrade moves
them.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import timedelta
from functools import partial
from typing import Any

import amqp
from celery import Celery
from kombu import Connection

#: kombu ``driver_name`` of the py-amqp transport (``amqp://``, ``pyamqp://``).
PY_AMQP = "py-amqp"
#: kombu ``driver_name`` of the Redis transports (``redis://``, ``rediss://``, sentinel).
REDIS = "redis"
#: How many wrapped errors :func:`timed_out` looks through.
_MAX_CHAIN = 8


class PublishDeadlineError(TimeoutError):
    """The broker accepted nothing for ``outbox_publish_timeout``; the row was not tried."""


@dataclass(kw_only=True)
class Deadline:
    """The moment (on a monotonic clock) that a publish pass gives up on its broker.

    It lies ``timeout`` after the start of the pass, or after the broker last accepted a
    message (:meth:`progressed`): a stalled broker is waited for once, at most
    ``timeout``, while a pass of many rows to a broker that keeps answering is never cut.
    """

    at: float
    timeout: timedelta
    clock: Callable[[], float] = field(default=time.monotonic, compare=False)

    @classmethod
    def after(cls, timeout: timedelta, *, clock: Callable[[], float] = time.monotonic) -> Deadline:
        """The deadline ``timeout`` from now."""
        return cls(at=clock() + timeout.total_seconds(), timeout=timeout, clock=clock)

    def progressed(self) -> None:
        """The broker accepted a message: the next wait may last ``timeout`` again."""
        self.at = self.clock() + self.timeout.total_seconds()

    def remaining(self) -> float:
        """Seconds left, never below zero."""
        return max(self.at - self.clock(), 0.0)

    def check(self) -> float:
        """Seconds left for the next wait.

        Raises
        ------
        PublishDeadlineError
            No time is left.
        """
        left = self.remaining()
        if left <= 0:
            seconds = self.timeout.total_seconds()
            raise PublishDeadlineError(
                f"not tried: the broker accepted nothing for {seconds:g} s (outbox_publish_timeout)"
            )
        return left


def connect(app: Celery, deadline: Deadline) -> Connection:
    """A new connection to ``app``'s write broker, opened within the time left.

    Every later socket wait on it is bounded by that time too (:func:`socket_bounds`):
    a broker that accepts and then stalls costs at most what was left.

    Raises
    ------
    PublishDeadlineError
        No time is left.
    Exception
        Whatever the transport raised; the half-open connection is dropped first.
    """
    seconds = deadline.check()
    conn = app.connection_for_write(
        connect_timeout=seconds,
        transport_options={"confirm_publish": True, "max_retries": 0},
    )
    try:
        bounds = socket_bounds(conn.transport.driver_name, seconds)
        conn.transport_options = {**(conn.transport_options or {}), **bounds}
        conn.ensure_connection(max_retries=0, timeout=seconds)  # type: ignore[arg-type]
        bound(conn, deadline)
    except BaseException:
        discard(conn)
        raise
    return conn


def socket_bounds(driver_name: str, seconds: float) -> dict[str, Any]:
    """The transport options that bound each socket wait of a transport to ``seconds``.

    Each transport spells them its own way, and ignores the others' names silently:
    py-amqp takes ``read_timeout``/``write_timeout`` (not ``socket_timeout``), Redis takes
    ``socket_timeout``/``socket_connect_timeout``. Other transports get none.
    """
    if driver_name == PY_AMQP:
        return {"read_timeout": seconds, "write_timeout": seconds}
    if driver_name == REDIS:
        return {"socket_timeout": seconds, "socket_connect_timeout": seconds}
    return {}


def bound(conn: Connection, deadline: Deadline) -> float:
    """Bound the next socket waits of ``conn`` by the time left; return that time.

    py-amqp waits frame by frame on one socket, and its ``read_timeout`` (``SO_RCVTIMEO``)
    lets a frame cut in half wait forever: its socket gets a timeout of its own, renewed
    before each step. Redis's waits are bounded per connection (:func:`socket_bounds`);
    a pass starts them at once (one pipeline), or on a connection it opened itself.

    Raises
    ------
    PublishDeadlineError
        No time is left.
    """
    seconds = deadline.check()
    if conn.transport.driver_name == PY_AMQP and conn.connected:
        conn.connection.sock.settimeout(seconds)
    return seconds


def reuse_client(channel: Any) -> None:
    """Make a kombu Redis ``channel`` publish through one ``redis.Redis`` client.

    kombu's Redis channel builds a new client for every publish (``conn_or_acquire()``
    without a client calls ``_create_client()``): about 0.2 ms of CPU each, mostly the
    client's table of response callbacks, on the request's path for every on-commit
    publish. A client is only a view on the channel's connection pool, so one per pool
    serves every publish of the channel (one per thread here). Other transports are left
    as they are.
    """
    if getattr(channel.connection, "driver_name", None) != REDIS:
        return
    create = channel._create_client
    made: dict[str, Any] = {}

    def create_client(asynchronous: bool = False) -> Any:
        if asynchronous:
            return create(asynchronous=True)
        client = made.get("client")
        if client is None or client.connection_pool is not channel.pool:
            client = made["client"] = create()
        return client

    channel._create_client = create_client


def discard(conn: Connection) -> None:
    """Drop ``conn`` without waiting for the broker (no close handshake).

    A graceful close waits for the broker's answer (py-amqp's ``channel.close`` and
    ``connection.close``), which a stalled broker never sends; kombu's ``collect`` closes
    the sockets only.
    """
    conn.collect()


def timed_out(exc: BaseException) -> bool:
    """Whether ``exc`` or an error it wraps is a timeout: the broker stalls, or the time is up.

    kombu wraps transport errors (``OperationalError`` from the cause), and redis-py's
    ``redis.exceptions.TimeoutError`` is no builtin ``TimeoutError``: it is known by name.
    """
    seen: BaseException | None = exc
    for _ in range(_MAX_CHAIN):
        if seen is None:
            return False
        if isinstance(seen, TimeoutError) or type(seen).__name__ == "TimeoutError":
            return True
        seen = seen.__cause__ or seen.__context__
    return False


def close(conn: Connection, deadline: Deadline) -> None:
    """Close ``conn`` gracefully, each goodbye awaited at most the time left; else drop it."""
    try:
        bound(conn, deadline)
        conn.release()
    except Exception:  # noqa: BLE001 - a connection that cannot say goodbye is dropped
        discard(conn)


class Confirms:
    """The publisher confirms of one new py-amqp channel, so that many publishes wait once.

    RabbitMQ numbers a channel's publishes 1, 2, 3... from its ``confirm.select`` and confirms
    each once, alone or with every earlier one (``multiple``). py-amqp counts nothing: this
    counts the channel's publishes through its ``_basic_publish``, restarts at its
    ``confirm_select``, and hears every ack and nack through its ``events``.
    """

    #: Why a row whose message the broker nacked was not published (a row's ``last_error``).
    NACKED = "amqp.exceptions.MessageNacked: the broker nacked it (publisher confirms)"

    def __init__(self, channel: Any) -> None:
        self.channel = channel
        self.last_tag = 0  # the delivery tag of the channel's last publish
        self._floor = 0  # every tag up to this one is confirmed (a ``multiple`` confirm)
        self._first = 1  # the tag of the first publish of the last unawaited()
        self._outcomes: list[bool | None] = []  # of each of its publishes (None: not yet)
        self._unsettled = 0  # how many of them are None
        publish = channel._basic_publish
        select = channel.confirm_select

        def counted_publish(*args: Any, **kwargs: Any) -> Any:
            self.last_tag += 1  # if it raises, the connection is dropped with this count
            return publish(*args, **kwargs)

        def counted_select(*args: Any, **kwargs: Any) -> Any:
            self.last_tag = self._floor = 0
            return select(*args, **kwargs)

        channel._basic_publish = counted_publish
        channel.confirm_select = counted_select
        channel.events["basic_ack"].add(partial(self._settle, acked=True))
        channel.events["basic_nack"].add(partial(self._settle, acked=False))

    @contextmanager
    def unawaited(self) -> Iterator[None]:
        """Within: the channel's publishes go out without waiting for their confirms
        (:meth:`wait` waits for them all; :meth:`outcomes` tells them after an error).
        """
        channel = self.channel
        self._outcomes = []
        self._unsettled = 0
        if not channel._confirm_selected:  # as basic_publish_confirm does
            channel._confirm_selected = True
            channel.confirm_select()
        self._first = self.last_tag + 1

        def publish(*args: Any, **kwargs: Any) -> None:
            channel._basic_publish(*args, **kwargs)
            self._outcomes.append(None)
            self._unsettled += 1

        confirming = channel.basic_publish
        channel.basic_publish = publish
        try:
            yield
        finally:
            channel.basic_publish = confirming

    def wait(self, deadline: Deadline) -> list[bool]:
        """Wait for the confirm of every message :meth:`unawaited` sent, each renewing
        ``deadline``: acked (True) or nacked, in order. After an error, drop the connection.

        Raises
        ------
        PublishDeadlineError
            No time is left.
        Exception
            Whatever the connection raised (a ``TimeoutError`` when it stalls).
        """
        while unsettled := self._unsettled:
            self.channel.connection.drain_events(timeout=deadline.check())
            if self._unsettled < unsettled:
                deadline.progressed()
        settled = [bool(acked) for acked in self._outcomes]
        self._outcomes = []
        return settled

    def outcomes(self) -> list[bool | None]:
        """Per publish of the :meth:`unawaited` not yet waited for, in order: whether the
        broker acked (True) or nacked (False) it; None while unknown.
        """
        return list(self._outcomes)

    def _settle(self, tag: int, multiple: bool, *, acked: bool) -> None:
        first = self._floor + 1 if multiple else tag
        if multiple:
            self._floor = max(self._floor, tag)
        last = min(tag - self._first, len(self._outcomes) - 1)
        for index in range(max(first - self._first, 0), last + 1):
            if self._outcomes[index] is None:
                self._outcomes[index] = acked
                self._unsettled -= 1


def confirms(channel: Any) -> Confirms | None:
    """A tracker of a new ``channel``'s confirms if it asks for them (py-amqp), else None."""
    if isinstance(channel, amqp.Channel) and channel.connection.confirm_publish:
        return Confirms(channel)
    return None
