"""The outbox store of Celery's integration app in the compatibility run.

Named by the ``outbox_store`` setting (``tests.celery_compat.store:build``): the SQLAlchemy
store on the PostgreSQL database in ``CELERY_COMPAT_DATABASE``. Celery's tests build a new
app for every test, so every store of a process shares one engine (one small pool), or the
run would exhaust the server's connections. Celery's test worker forks its pool from the
pytest process: a forked child drops the pooled connections it inherited instead of
sharing their sockets with its parent.
"""

from __future__ import annotations

import functools
import os

from celery import Celery
from sqlalchemy import Engine, create_engine

from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from celery_outbox.sqlalchemy import metadata as outbox_metadata


@functools.cache
def _engine(url: str) -> Engine:
    engine = create_engine(url, pool_size=2, max_overflow=2)
    outbox_metadata.create_all(engine)
    os.register_at_fork(after_in_child=lambda: engine.dispose(close=False))
    return engine


def build(app: Celery) -> SQLAlchemyOutboxStore:
    """The store of ``app``, on the process's one engine (tables created if missing)."""
    return SQLAlchemyOutboxStore(engine=_engine(os.environ["CELERY_COMPAT_DATABASE"]))
