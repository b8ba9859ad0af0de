"""The Celery app of the Django end-to-end tests, for the test process and its workers.

Its one task, ``record``, appends a JSON line to the file named by ``OUTBOX_TEST_OUTPUT``:
its task id, and whether it found the user the dispatching transaction created. A worker
runs ``-A tests.django.worker_app``, which builds this app from its environment.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from celery import Celery, Task

from celery_outbox import OutboxTask

#: The registered name of the recording task.
RECORD = "django_e2e.record"


def create_app(broker_url: str, queue: str, **conf: Any) -> Celery:
    """An app on ``broker_url`` routing every task to ``queue``, with ``record`` registered."""
    app = Celery("django_e2e", broker=broker_url, set_as_current=False)
    app.conf.update(
        task_default_queue=queue,
        broker_connection_retry_on_startup=True,
        worker_hijack_root_logger=False,
        **conf,
    )
    app.task(base=OutboxTask, bind=True, name=RECORD)(record)
    return app


def record(self: Task, user_id: int | None = None, using: str = "default") -> bool:
    """Append this run to ``OUTBOX_TEST_OUTPUT``; return whether user ``user_id`` exists."""
    from django.contrib.auth.models import User

    saw = user_id is not None and User.objects.using(using).filter(pk=user_id).exists()
    line = json.dumps({"task_id": self.request.id, "user_id": user_id, "saw_user": saw})
    with Path(os.environ["OUTBOX_TEST_OUTPUT"]).open("a") as output:
        output.write(line + "\n")
    return saw


def runs(path: Path) -> list[dict[str, Any]]:
    """The runs recorded so far in ``path``."""
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
