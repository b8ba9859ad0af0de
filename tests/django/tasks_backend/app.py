"""The Celery apps of the ``django.tasks`` backend tests (Django 6+).

``app`` is the app of the backend ``default`` (``TASKS`` in :mod:`djtasks_settings`): a
real broker, a Redis result backend with ``result_extended``, every task on one queue.
It reads ``OUTBOX_TEST_BROKER`` and ``OUTBOX_TEST_QUEUE`` when they are set (workers and
clients); the test process calls :func:`configure` instead. ``plain_app`` has no result
backend (the backend ``plain``).
"""

from __future__ import annotations

import os

from celery import Celery
from kombu import Queue

app = Celery("djtasks", set_as_current=False)
plain_app = Celery("djtasks_plain", broker="memory://", set_as_current=False)


def configure(broker_url: str, queue: str) -> None:
    """Point :data:`app` at ``broker_url`` (also its result backend) and ``queue``."""
    app.conf.update(
        broker_url=broker_url,
        result_backend=broker_url,
        result_extended=True,
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        outbox_sweep_interval=0.5,
        outbox_publish_grace=0.0,
        outbox_park_after=1.0,
        outbox_beat_schedule=False,
    )


if os.environ.get("OUTBOX_TEST_BROKER"):
    configure(os.environ["OUTBOX_TEST_BROKER"], os.environ["OUTBOX_TEST_QUEUE"])

#: Creates no missing queue: only ``declared`` (and the default queue) can be routed to.
strict_app = Celery("djtasks_strict", broker="memory://", set_as_current=False)
strict_app.conf.update(task_create_missing_queues=False, task_queues=[Queue("declared")])
