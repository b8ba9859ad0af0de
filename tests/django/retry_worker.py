"""Worker entry point of the retry tests: ``celery -A tests.django.retry_worker worker``.

Reads the broker, queue and extra ``outbox_*`` settings from its environment
(``OUTBOX_TEST_CONF`` holds them as JSON), tasks with bad options from
``OUTBOX_TEST_MISCONFIGURED`` (JSON), the database through ``db_settings``.
"""

from __future__ import annotations

import json
import os

import django

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django.db_settings"
django.setup()

from tests.django.retry_tasks import create_retry_app  # noqa: E402  (after django.setup)

app = create_retry_app(
    os.environ["OUTBOX_TEST_BROKER"],
    os.environ["OUTBOX_TEST_QUEUE"],
    misconfigured=json.loads(os.environ.get("OUTBOX_TEST_MISCONFIGURED", "{}")),
    **json.loads(os.environ.get("OUTBOX_TEST_CONF", "{}")),
)
