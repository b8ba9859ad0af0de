"""Shared pieces of the worker unit tests: an attempt of ``unit.retrying`` and the
queue it is sent back to."""

from __future__ import annotations

from kombu import Connection, Queue

from celery_outbox.worker.attempt import Attempt

#: Name of the outbox task of the ``app`` fixture (``tests/unit/worker/conftest.py``).
TASK = "unit.retrying"


def attempt_of(task_id: str, queue: str) -> Attempt:
    """The first attempt of ``unit.retrying`` with ``task_id``, delivered from ``queue``."""
    return Attempt(
        task_name=TASK,
        task_id=task_id,
        args=(1,),
        delivery_info={"exchange": "", "routing_key": queue, "priority": None},
        options={"queue": queue},
    )


def queued_ids(queue_name: str) -> list[str]:
    """Task ids of the messages waiting in the memory broker's ``queue_name`` (taken)."""
    with Connection("memory://") as conn:
        queue = Queue(queue_name)(conn.default_channel)
        ids = []
        while (message := queue.get(no_ack=True)) is not None:
            ids.append(message.headers["id"])
        return ids
