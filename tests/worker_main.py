"""``python -m tests.worker_main``: the ``celery`` command, whose workers stop at once when idle.

An idle worker notices a shutdown signal only when its event loop next wakes, and kombu's hub
sleeps up to 10 s when no timer is due (an idle RabbitMQ worker): every test that stopped such
a worker waited that long. Here, once the worker is ready, one end of a socket pair is
registered with its hub (public Celery signals and ``Hub.add_reader`` only); the shutdown
signal handler writes a byte to the other end, the poll returns, and the loop sees the
shutdown flag at once. Everything else is the ``celery`` command unchanged.
"""

from __future__ import annotations

import contextlib
import socket
from typing import Any

from celery import signals
from kombu.asynchronous import get_event_loop

_reader, _writer = socket.socketpair()
_reader.setblocking(False)
_writer.setblocking(False)


def _drain() -> None:
    with contextlib.suppress(OSError):
        _reader.recv(4096)


@signals.worker_ready.connect
def _listen_for_shutdown(**_: Any) -> None:
    """Let the shutdown signal wake the worker's event loop (no loop: nothing to wake)."""
    hub = get_event_loop()
    if hub is not None:
        hub.add_reader(_reader.fileno(), _drain)


@signals.worker_shutting_down.connect
def _wake_the_loop(**_: Any) -> None:
    """Runs inside the SIGTERM/SIGINT/SIGQUIT handler: wake the poll, never block."""
    with contextlib.suppress(OSError):
        _writer.send(b"\0")


if __name__ == "__main__":
    from celery.__main__ import main

    main()
