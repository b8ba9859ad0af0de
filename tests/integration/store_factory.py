"""The ``outbox_store`` factory ``docs/sqlalchemy.md`` shows, for ``test_store_setting.py``."""

from __future__ import annotations

from celery import Celery
from sqlalchemy import create_engine

from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore


def make_store(app: Celery) -> SQLAlchemyOutboxStore:
    """The SQLAlchemy store on ``app.conf.database_url``."""
    return SQLAlchemyOutboxStore(engine=create_engine(app.conf.database_url))
