"""A ``django.tasks`` backend (Django 6+) that dispatches through the outbox and runs on Celery.

``TASKS = {"default": {"BACKEND": "django_outbox.tasks.OutboxBackend"}}``; then
``@task`` functions (Django's decorator, or :func:`task` for the outbox's per-task retry
options) are enqueued as outbox rows of the current transaction and run on the Celery
workers as ``OutboxTask`` s. See ``docs/django-tasks.md``.

On Django < 6 this package is empty, not an import error: Celery's ``autodiscover_tasks``
imports ``<app>.tasks`` of every installed app, ``django_outbox`` included.
"""

from __future__ import annotations

from importlib.util import find_spec

__all__: list[str] = []

if find_spec("django.tasks") is not None:  # Django >= 6.0
    from django_outbox.tasks.backend import OutboxBackend
    from django_outbox.tasks.definition import DurableTask, task

    __all__ = ["DurableTask", "OutboxBackend", "task"]
