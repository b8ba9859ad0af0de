"""The relay's wait (``celery_outbox.relay.loop``) with stand-in connections: a socket pair
plays the database's socket. Real PostgreSQL (NOTIFY, a killed backend):
``tests/integration/test_relay_notify.py``.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator

import pytest

from celery_outbox.relay.loop import Wakeups


class FakeClock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class SocketConnection:
    """A DB-API-shaped connection whose statements read what the peer sent."""

    def __init__(self, sock: socket.socket) -> None:
        self.sock, self.autocommit, self.statements = sock, False, list[str]()
        self.notifies: list[object] = ["left over"]

    def fileno(self) -> int:
        return self.sock.fileno()

    def cursor(self) -> Cursor:
        return Cursor(self)

    def close(self) -> None:
        self.sock.close()


class Cursor:
    description = None

    def __init__(self, connection: SocketConnection) -> None:
        self.connection = connection

    def execute(self, sql: str) -> None:
        self.connection.statements.append(sql)
        if sql == "SELECT 1":
            self.connection.sock.setblocking(False)
            try:
                if not self.connection.sock.recv(4096):
                    raise OSError("server closed the connection")
            except BlockingIOError:
                pass

    def close(self) -> None:
        pass


@pytest.fixture
def pair() -> Iterator[tuple[SocketConnection, socket.socket]]:
    ours, server = socket.socketpair()
    yield SocketConnection(ours), server
    server.close()
    ours.close()


def test_without_connectors_it_is_a_plain_timed_wait() -> None:
    wakeups = Wakeups()
    assert wakeups.wait(0.01, threading.Event()) is False
    assert wakeups.listening == 0


def test_a_failing_listen_is_retried_after_retry_seconds_and_logged_once(
    caplog: pytest.LogCaptureFixture,
) -> None:
    calls: list[int] = []

    def refuse() -> object:
        calls.append(1)
        raise OSError("connection refused")

    clock, stop = FakeClock(), threading.Event()
    wakeups = Wakeups([refuse], retry=5.0, clock=clock)
    with caplog.at_level(logging.WARNING, logger="celery_outbox.relay.loop"):
        assert wakeups.wait(0.0, stop) is False
        assert wakeups.wait(0.0, stop) is False
        assert len(calls) == 1
        clock.now = 5.0
        assert wakeups.wait(0.0, stop) is False
    assert len(calls) == 2
    assert caplog.text.count("cannot LISTEN for new outbox rows (connection refused)") == 1
    assert wakeups.listening == 0


def test_it_listens_in_autocommit_and_a_new_listen_ends_the_wait(
    pair: tuple[SocketConnection, socket.socket],
) -> None:
    connection, _ = pair
    wakeups = Wakeups([lambda: connection])
    assert wakeups.wait(60.0, threading.Event()) is True
    assert connection.autocommit is True
    assert connection.statements == ['LISTEN "celery_outbox"']
    assert wakeups.listening == 1


def test_something_to_read_ends_the_wait_and_is_drained(
    pair: tuple[SocketConnection, socket.socket],
) -> None:
    connection, server = pair
    stop = threading.Event()
    wakeups = Wakeups([lambda: connection])
    wakeups.wait(0.0, stop)
    server.sendall(b"notification")
    assert wakeups.wait(60.0, stop) is True
    assert connection.statements[-1] == "SELECT 1"
    assert connection.notifies == []  # psycopg2's list is emptied
    assert wakeups.listening == 1


def test_stop_ends_the_wait(pair: tuple[SocketConnection, socket.socket]) -> None:
    connection, _ = pair
    stop = threading.Event()
    wakeups = Wakeups([lambda: connection])
    wakeups.wait(0.0, stop)
    threading.Timer(0.05, stop.set).start()
    assert wakeups.wait(3600.0, stop) is False


def test_a_lost_connection_ends_the_wait_and_falls_back_to_polling(
    pair: tuple[SocketConnection, socket.socket], caplog: pytest.LogCaptureFixture
) -> None:
    connection, server = pair
    clock, stop = FakeClock(), threading.Event()
    wakeups = Wakeups([lambda: connection], retry=5.0, clock=clock)
    wakeups.wait(0.0, stop)
    server.close()
    with caplog.at_level(logging.WARNING, logger="celery_outbox.relay.loop"):
        assert wakeups.wait(3600.0, stop) is True
    assert "lost the LISTEN connection" in caplog.text
    assert wakeups.listening == 0
    assert wakeups.wait(0.0, stop) is False  # polling until clock 5.0


def test_close_closes_every_connection(pair: tuple[SocketConnection, socket.socket]) -> None:
    connection, _ = pair
    wakeups = Wakeups([lambda: connection])
    wakeups.wait(0.0, threading.Event())
    wakeups.close()
    assert wakeups.listening == 0
    assert connection.sock.fileno() == -1
