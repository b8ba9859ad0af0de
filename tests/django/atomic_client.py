"""A process driving the atomic end-to-end tasks on the database its environment names.

``python -m tests.django.atomic_client STEP KEY`` runs with ``tests.django.db_settings``
(MySQL/MariaDB and SQLite get a Django of their own, outside pytest-django's PostgreSQL)
and the broker and queue of ``OUTBOX_TEST_BROKER`` and ``OUTBOX_TEST_QUEUE``:

``start``
    create the counter ``KEY``, dispatch ``atomic.bump`` (task id ``bump-KEY``) and
    ``atomic.flaky`` (``flaky-KEY``, fails once), each in a transaction of its own
``again``
    dispatch ``atomic.bump`` with the task id ``bump-KEY`` again (a duplicate)
``sweep``
    sweep once: publish the rows whose publish after commit failed (on SQLite two worker
    processes claiming at once may get "database is locked"; the sweep is the recovery)
``read``
    print the counter, the ``CompletedTask`` rows and the outbox rows left, as JSON
"""

from __future__ import annotations

import json
import os
import sys

import django

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django.db_settings"
django.setup()

from django.db import connection, transaction  # noqa: E402

from celery_outbox.sweep_task import sweep_app  # noqa: E402
from django_outbox.models import CompletedTask, OutboxMessage  # noqa: E402
from tests.django.atomic_tasks import counter, create_atomic_app, create_counter  # noqa: E402


def main(step: str, key: str) -> None:
    app = create_atomic_app(os.environ["OUTBOX_TEST_BROKER"], os.environ["OUTBOX_TEST_QUEUE"])
    if step == "start":
        create_counter(key)
        with transaction.atomic():
            app.tasks["atomic.bump"].apply_async(args=[key], task_id=f"bump-{key}")
        with transaction.atomic():
            app.tasks["atomic.flaky"].apply_async(args=[key], task_id=f"flaky-{key}")
    elif step == "again":
        with transaction.atomic():
            app.tasks["atomic.bump"].apply_async(args=[key], task_id=f"bump-{key}")
    elif step == "sweep":
        sweep_app(app)
    elif step == "read":
        rows = CompletedTask.objects.order_by("task_id").values_list("task_id", "result")
        print(
            json.dumps(
                {
                    "vendor": connection.vendor,
                    "counter": counter(key),
                    "completed": {task_id: json.loads(result) for task_id, result in rows},
                    "outbox_rows": OutboxMessage.objects.count(),
                }
            )
        )
    else:
        raise SystemExit(f"unknown step {step!r}: give start, again, sweep or read")
    app.close()


if __name__ == "__main__":
    main(*sys.argv[1:])
