"""A Celery app with no outbox store, for ``celery -A ... outbox status``'s refusal."""

from __future__ import annotations

from celery import Celery

app = Celery("console_nostore", broker="memory://", set_as_current=False)
