"""A process that enqueues one Django task, prints its id, commits, and is killed
(SIGKILL) right after COMMIT, before its on-commit publisher runs.

``python -m tests.django.tasks_backend.client KEY`` with ``tests.django.tasks_backend.settings``.
"""

from __future__ import annotations

import os
import signal
import sys

import django

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django.tasks_backend.settings"
django.setup()

from django.db import transaction  # noqa: E402

from tests.django.tasks_backend.functions import record  # noqa: E402


def main(key: str) -> None:
    with transaction.atomic():
        # Registered first, so it runs first after COMMIT: before the outbox's publisher.
        transaction.on_commit(lambda: os.kill(os.getpid(), signal.SIGKILL))
        result = record.enqueue(key, "swept")
        print(result.id, flush=True)


if __name__ == "__main__":
    main(sys.argv[1])
