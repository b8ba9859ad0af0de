"""The outbox store of Celery's integration app in the compatibility run.

Named by the ``outbox_store`` setting (``tests.celery_compat.store:build``): the SQLAlchemy
store on the PostgreSQL database in ``CELERY_COMPAT_DATABASE``. Celery's test worker forks
its pool from the pytest process, so a forked child drops the pooled connections it
inherited instead of sharing their sockets with its parent.
"""

from __future__ import annotations

import os

from celery import Celery
from sqlalchemy import create_engine

from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from celery_outbox.sqlalchemy import metadata as outbox_metadata


def build(app: Celery) -> SQLAlchemyOutboxStore:
    """The store of ``app``: tables created if missing."""
    engine = create_engine(os.environ["CELERY_COMPAT_DATABASE"])
    outbox_metadata.create_all(engine)
    os.register_at_fork(after_in_child=lambda: engine.dispose(close=False))
    return SQLAlchemyOutboxStore(engine=engine)
