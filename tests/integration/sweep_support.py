"""Helpers of the sweeper's integration tests: a redis-server of their own, queue draining."""

from __future__ import annotations

import shutil
import socket
import subprocess
from collections import Counter
from pathlib import Path

import pytest
from amqp.exceptions import ChannelError
from kombu import Connection
from kombu.message import Message

from tests.brokers import celery_queue
from tests.services import PROBE_TIMEOUT, free_port
from tests.worker import wait_for


class ThrowawayRedis:
    """A ``redis-server`` this test starts and stops (never the shared one)."""

    def __init__(self, workdir: Path) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.skip("redis-server is not installed")
        self.binary, self.workdir, self.port = binary, workdir, free_port()
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> None:
        """Start the server on its port (empty: no persistence) and wait until it answers."""
        argv = [
            self.binary,
            "--port",
            str(self.port),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
            str(self.workdir),
        ]
        self.process = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        wait_for(self._answers, timeout=10, what=f"redis-server on port {self.port}")

    def stop(self) -> None:
        """Kill the server (the broker goes down) and wait for it to exit."""
        if self.process is not None:
            self.process.kill()
            self.process.wait(timeout=10)
            self.process = None

    def connections_received(self) -> int:
        """``total_connections_received``: every connection the server ever accepted."""
        import redis

        client = redis.Redis(port=self.port, socket_timeout=PROBE_TIMEOUT)
        try:
            # Our own INFO connection counts too: subtract it.
            return int(client.info("stats")["total_connections_received"]) - 1
        finally:
            client.close()

    def _answers(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.2):
                return True
        except OSError:
            return False


def drain_task_ids(broker_url: str, queue: str, *, idle: float = 1.0) -> Counter[str]:
    """Consume every message of ``queue``; how many times each task id was there.

    A consumer (the broker pushes, ``no_ack``) rather than one ``get`` round trip
    per message: 20,000 gets cost a minute on RabbitMQ. Done once nothing came for ``idle``
    seconds.
    """
    seen: Counter[str] = Counter()

    def count(message: Message) -> None:
        seen[message.headers["id"]] += 1

    with Connection(broker_url, connect_timeout=PROBE_TIMEOUT) as conn:
        celery_queue(queue)(conn.default_channel).declare()
        with conn.Consumer([celery_queue(queue)], no_ack=True, on_message=count):
            while True:
                try:
                    conn.drain_events(timeout=idle)
                except TimeoutError:
                    return seen


def queued_count(broker_url: str, queue: str) -> int:
    """How many messages wait in ``queue`` (a passive declare; nothing is consumed)."""
    with Connection(broker_url, connect_timeout=PROBE_TIMEOUT) as conn:
        try:
            return int(celery_queue(queue)(conn.default_channel).queue_declare(passive=True)[1])
        except ChannelError:  # not declared yet: nothing was published
            return 0


def run_lines(path: Path) -> Counter[str]:
    """How many times each task id ran (lines ``"<task id> <n>"`` of the run file)."""
    if not path.exists():
        return Counter()
    return Counter(line.split()[0] for line in path.read_text().splitlines() if line)
