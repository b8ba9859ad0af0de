"""Django settings of the ``django.tasks`` backend tests' workers and clients:
:mod:`tests.django.db_settings` plus :data:`TASKS`.
"""

from __future__ import annotations

from tests.django.db_settings import *  # noqa: F403

#: The backends under test: ``default`` (Redis results) and ``plain`` (no result backend).
TASKS = {
    "default": {
        "BACKEND": "django_outbox.tasks.OutboxBackend",
        "QUEUES": ["default", "djtasks-other"],
        "OPTIONS": {"CELERY_APP": "tests.django.tasks_backend.app:app"},
    },
    "plain": {
        "BACKEND": "django_outbox.tasks.OutboxBackend",
        "OPTIONS": {"CELERY_APP": "tests.django.tasks_backend.app:plain_app"},
    },
}
