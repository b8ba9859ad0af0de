"""A plain Celery app (no outbox) for the worker fixture's own test.

It reads its broker from ``OUTBOX_TEST_BROKER``, its queue from ``OUTBOX_TEST_QUEUE`` and the file
its task appends to from ``OUTBOX_TEST_OUTPUT``, so a worker subprocess gets them from its env.
"""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery

#: The registered name of the task that appends a line.
APPEND_LINE = "plain.append_line"


def create_app(broker_url: str, queue: str) -> Celery:
    """A Celery app on ``broker_url`` routing every task to ``queue``, with ``append_line``."""
    app = Celery("plain_app", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        task_acks_late=True,
    )
    app.task(name=APPEND_LINE)(append_line)
    return app


def append_line(text: str) -> None:
    """Append ``text`` and a newline to the file named by ``OUTBOX_TEST_OUTPUT``."""
    with Path(os.environ["OUTBOX_TEST_OUTPUT"]).open("a") as output:
        output.write(f"{text}\n")


app = create_app(
    os.environ.get("OUTBOX_TEST_BROKER", "memory://"), os.environ.get("OUTBOX_TEST_QUEUE", "celery")
)
