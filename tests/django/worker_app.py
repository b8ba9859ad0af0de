"""Worker entry point: ``celery -A tests.django.worker_app worker``.

Reads ``OUTBOX_TEST_BROKER``, ``OUTBOX_TEST_QUEUE`` and (through
``DJANGO_SETTINGS_MODULE=tests.django.db_settings``) the database from its environment.
"""

from __future__ import annotations

import os

import django

# Not setdefault: a worker started from pytest inherits pytest-django's settings module.
os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django.db_settings"
django.setup()

from tests.django.celery_app import create_app  # noqa: E402  (Django must be set up first)

app = create_app(os.environ["OUTBOX_TEST_BROKER"], os.environ["OUTBOX_TEST_QUEUE"])
