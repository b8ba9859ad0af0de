"""The SQLAlchemy store claims ahead on PostgreSQL only
(:mod:`celery_outbox.sqlalchemy.store`); ``tests/integration/test_sweep.py``
sweeps a real PostgreSQL backlog with it.
"""

from __future__ import annotations

import pytest
from sqlalchemy import create_engine

from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore


@pytest.mark.parametrize(
    ("url", "aside"),
    [
        ("postgresql+psycopg://user@127.0.0.1:1/db", True),  # create_engine does not connect
        ("sqlite://", False),
        ("mysql+pymysql://root@127.0.0.1:1/db", False),
    ],
)
def test_claims_aside_on_postgresql_only(url: str, aside: bool) -> None:
    engine = create_engine(url)
    try:
        store = SQLAlchemyOutboxStore(engine=engine)
        assert store.claims_aside() is aside
        assert store.end_claims_aside() is None  # the pool has the connection back already
    finally:
        engine.dispose()
