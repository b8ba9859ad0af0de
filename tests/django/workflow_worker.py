"""Worker entry point of the Django workflow tests:
``celery -A tests.django.workflow_worker worker``.

Reads the broker and queue from its environment, the database through ``db_settings``.
"""

from __future__ import annotations

import os

import django

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django.db_settings"
django.setup()

from tests.django.workflow_tasks import create_workflow_app  # noqa: E402  (after django.setup)

app = create_workflow_app(os.environ["OUTBOX_TEST_BROKER"], os.environ["OUTBOX_TEST_QUEUE"])
