"""RabbitMQ killed while a part of rows waits for its publisher confirms.

On RabbitMQ the relay writes a whole part on the confirm channel, then waits once for the
confirms (:class:`~celery_outbox.broker.Confirms`). Here the broker, a throwaway node
(:mod:`tests.reliability.rabbit_server`; the shared one is never stopped), is SIGKILLed
as that wait starts. The rows whose messages the broker confirmed before it died are
reported published; the others are failed (they stay pending for the sweeper): the
fall-back, publishing them one by one, finds no broker. Nothing waits longer than
``outbox_publish_timeout``. Once the node is back, every message of a row reported
published is in its durable queue: RabbitMQ confirms a persistent message only once it
is on disk, so a row is let go of only when its message survives a crash.
"""

from __future__ import annotations

import time
from datetime import timedelta
from typing import Any

import pytest
from celery import Celery
from kombu import Connection

from celery_outbox import OutboxTask
from celery_outbox.broker import Confirms, Deadline
from celery_outbox.producers import Producers
from celery_outbox.records import StoredMessage
from tests.messages import NOW, stored
from tests.reliability.rabbit_server import ThrowawayRabbitMQ

pytestmark = pytest.mark.slow

TASK = "reliability.confirms.noop"
#: Rows of the part cut by the crash, and outbox_publish_timeout (seconds).
ROWS, TIMEOUT = 2000, 2.0


def row(app: Celery, n: int) -> StoredMessage:
    """The row of ``noop(n)``, id ``n`` (:func:`tests.messages.stored`)."""
    return stored(app.tasks[TASK], n)


def queued(url: str, queue: str) -> set[str]:
    with Connection(url) as conn:
        channel = conn.default_channel
        ids = set()
        while (message := channel.basic_get(queue, no_ack=True)) is not None:
            ids.add(message.headers["id"])
        return ids


def test_rabbitmq_killed_during_the_wait_for_confirms_lets_go_of_no_unconfirmed_row(
    throwaway_rabbitmq: ThrowawayRabbitMQ, queue_name: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    node = throwaway_rabbitmq
    app = Celery("reliability-confirms", broker=node.url, set_as_current=False)
    app.conf.task_default_queue = queue_name  # durable, persistent messages: Celery's defaults

    @app.task(base=OutboxTask, name=TASK, shared=False)
    def noop(n: int) -> int:
        return n

    sender = Producers(
        app, timeout=timedelta(seconds=TIMEOUT), batch_bytes=1 << 26, clock=lambda: NOW
    )
    assert sender.send([row(app, 0)], path="sweep").published == [0]  # declares the queue
    killing: list[float] = []
    wait = Confirms.wait

    def killed_first(confirms: Confirms, deadline: Deadline) -> Any:
        started = time.monotonic()
        node.stop(mode="kill")
        killing.append(time.monotonic() - started)
        return wait(confirms, deadline)

    monkeypatch.setattr(Confirms, "wait", killed_first)
    started = time.monotonic()
    sent = sender.send([row(app, n) for n in range(1, ROWS + 1)], path="sweep")
    took = time.monotonic() - started
    monkeypatch.undo()
    sender.discard()

    assert len(killing) == 1, "the part did not wait for its confirms"
    assert sorted([*sent.published, *sent.failed]) == list(range(1, ROWS + 1))
    assert sent.failed, "the broker confirmed every message before it was killed: no test"
    # Writing the part and killing the node take their time; the waits after it, at most
    # one timeout (the fall-back's connect is refused at once).
    assert took - killing[0] < TIMEOUT + 5.0, f"took {took:.2f} s, the kill {killing[0]:.2f} s"

    node.start()
    survived = queued(node.url, queue_name)
    lost = {f"task-{n}" for n in sent.published} - survived
    assert not lost, f"{len(lost)} rows reported published lost their message: {sorted(lost)}"
    assert "task-0" in survived
    app.close()
