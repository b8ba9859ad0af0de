"""A process dispatching through the outbox on the database its environment names.

``python -m tests.django.dispatch_client`` runs with ``tests.django.db_settings`` (so
MySQL/MariaDB and SQLite get a Django of their own, outside pytest-django's PostgreSQL)
and the broker and queue of ``OUTBOX_TEST_BROKER`` and ``OUTBOX_TEST_QUEUE``. It commits
one dispatch, rolls back two (a transaction and a savepoint), dispatches one explicit
task id twice in one transaction, then a sentinel, and prints what it did as JSON.
"""

from __future__ import annotations

import json
import os
import sys
from typing import Any

import django

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django.db_settings"
django.setup()

from django.contrib.auth.models import User  # noqa: E402
from django.db import connection, transaction  # noqa: E402

from django_outbox.models import OutboxMessage  # noqa: E402
from tests.django.celery_app import RECORD, create_app  # noqa: E402


class Rollback(Exception):
    """Raised to roll an ``atomic`` block back."""


def dispatch(record: Any) -> dict[str, Any]:
    """Run the scenario; return the task ids that must run, in order."""
    with transaction.atomic():
        user = User.objects.create(username="committed")
        committed = record.delay(user.pk)
    try:
        with transaction.atomic():
            record.delay(User.objects.create(username="rolled-back").pk)
            raise Rollback
    except Rollback:
        pass
    with transaction.atomic():
        try:
            with transaction.atomic():
                record.delay(User.objects.create(username="savepoint").pk)
                raise Rollback
        except Rollback:
            pass
        first = record.apply_async((user.pk,), task_id="explicit-id")
        second = record.apply_async((user.pk,), task_id="explicit-id")
        rows_for_explicit_id = OutboxMessage.objects.filter(task_id="explicit-id").count()
    sentinel = record.delay(None)
    return {
        "vendor": connection.vendor,
        "expected": [committed.id, first.id, sentinel.id],
        "same_result": first.id == second.id,
        "rows_for_explicit_id": rows_for_explicit_id,
        "rows_left": OutboxMessage.objects.count(),
        "user_id": user.pk,
    }


def main() -> None:
    """Dispatch and print the outcome."""
    app = create_app(os.environ["OUTBOX_TEST_BROKER"], os.environ["OUTBOX_TEST_QUEUE"])
    json.dump(dispatch(app.tasks[RECORD]), sys.stdout)


if __name__ == "__main__":
    main()
