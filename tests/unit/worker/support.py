"""Shared pieces of the worker unit tests: an attempt of ``unit.retrying`` and the
queue it is sent back to.
"""

from __future__ import annotations

from typing import Any

from celery import Task
from kombu import Connection, Queue
from kombu.message import Message

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


def queued_messages(queue_name: str) -> list[Message]:
    """The messages waiting in the memory broker's ``queue_name`` (taken)."""
    with Connection("memory://") as conn:
        queue = Queue(queue_name)(conn.default_channel)
        found = []
        while (message := queue.get(no_ack=True)) is not None:
            found.append(message)
        return found


def queued(queue_name: str) -> list[dict[str, Any]]:
    """Headers of the messages waiting in ``queue_name`` (taken)."""
    return [message.headers for message in queued_messages(queue_name)]


def queued_ids(queue_name: str) -> list[str]:
    """Task ids of the messages waiting in ``queue_name`` (taken)."""
    return [headers["id"] for headers in queued(queue_name)]


def queued_tasks(queue_name: str) -> list[tuple[str, tuple[Any, ...]]]:
    """``(task name, args)`` of the messages waiting in ``queue_name`` (taken)."""
    return [
        (message.headers["task"], tuple(message.decode()[0]))
        for message in queued_messages(queue_name)
    ]


def deliver(
    task: Task[Any, Any], *args: Any, task_id: str = "t1", queue: str = "q", **request: Any
) -> Any:
    """Run ``task`` as a worker runs one delivery of ``task_id`` from ``queue``: a pushed
    request (``request`` adds to it: headers, ``chain``, ``callbacks``).
    """
    task.push_request(
        **{
            "id": task_id,
            "args": args,
            "kwargs": {},
            "retries": 0,
            "is_eager": False,
            "called_directly": False,
            "delivery_info": {"exchange": "", "routing_key": queue, "redelivered": False},
            **request,
        }
    )
    try:
        return task(*args)
    finally:
        task.pop_request()
