"""celery-outbox without Django: a plain Celery app and SQLAlchemy on SQLite."""

from __future__ import annotations
