"""Worker of the ``django.tasks`` backend tests:
``celery -A tests.django.tasks_backend.worker worker``.

Records Django's ``task_started`` and ``task_finished`` signals in ``OUTBOX_TEST_OUTPUT``.
"""

from __future__ import annotations

import os
import time
from typing import Any

import django

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django.tasks_backend.settings"
django.setup()

from django.tasks.signals import task_finished, task_started  # noqa: E402

from tests.django.atomic_tasks import log  # noqa: E402
from tests.django.tasks_backend import functions  # noqa: E402, F401  (registers the tasks)
from tests.django.tasks_backend.app import app  # noqa: E402


def log_signal(sender: Any, task_result: Any, signal: Any, **kwargs: Any) -> None:
    """Record one of Django's task signals (its sender, the result's id and status)."""
    event = "started" if signal is task_started else "finished"
    log(
        event,
        task_result.task.name,
        task_result.id,
        status=str(task_result.status),
        sender=sender.__name__,
        attempt=task_result.attempts,
        at=time.time(),
    )


task_started.connect(log_signal, dispatch_uid="djtasks.started")
task_finished.connect(log_signal, dispatch_uid="djtasks.finished")
__all__ = ["app"]
