"""Worker entry point of the atomic tests: ``celery -A tests.django.atomic_worker worker``.

Reads the broker and queue from its environment, the database through ``db_settings``;
records each skipped duplicate from the Django signal ``task_duplicate_skipped``.
"""

from __future__ import annotations

import os

import django

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django.db_settings"
django.setup()

from django_outbox.signals import task_duplicate_skipped  # noqa: E402  (after django.setup)
from tests.django.atomic_tasks import create_atomic_app, log_skipped  # noqa: E402

task_duplicate_skipped.connect(log_skipped, dispatch_uid="atomic_e2e.skipped")
app = create_atomic_app(os.environ["OUTBOX_TEST_BROKER"], os.environ["OUTBOX_TEST_QUEUE"])
