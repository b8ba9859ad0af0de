"""The Celery app of the ``outbox`` command tests (``DJANGO_OUTBOX_CELERY_APP``).

A subprocess builds it from ``OUTBOX_TEST_BROKER`` and ``OUTBOX_TEST_QUEUE``; a test in
this process replaces :data:`app` with one of its own (the setting is resolved on use).
"""

from __future__ import annotations

import os

from celery import Celery

from tests.django.celery_app import create_app

#: Value of ``DJANGO_OUTBOX_CELERY_APP`` in these tests.
APP_PATH = "tests.django.outbox_command_app:app"

#: The app (replaceable: see the module docstring).
app: Celery = create_app(
    os.environ.get("OUTBOX_TEST_BROKER", "memory://"),
    os.environ.get("OUTBOX_TEST_QUEUE", "outbox-command-tests"),
    outbox_beat_schedule=False,
)
