"""The outbox for SQLAlchemy applications: tables for Alembic, and the store.

Imported only when asked for (``import celery_outbox`` never imports SQLAlchemy)::

    from celery_outbox.registry import install_store
    from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, metadata

    metadata.create_all(engine)            # or let Alembic see ``metadata``
    store = SQLAlchemyOutboxStore(engine=engine)
    install_store(celery_app, store)

    with Session(engine) as session, session.begin(), store.bind_session(session):
        session.add(order)
        send_receipt.delay(order.id)       # written in this transaction, published on commit

An atomic task (``atomic=True``) writes through :func:`atomic_session`: its writes, its
dispatches and its ``CompletedTask`` row commit together.
"""

from __future__ import annotations

from pathlib import Path

from celery_outbox.sqlalchemy.completions import atomic_session
from celery_outbox.sqlalchemy.store import SQLAlchemyOutboxStore
from celery_outbox.sqlalchemy.tables import (
    OutboxTables,
    chord_join_table,
    completed_table,
    dead_letter_table,
    define_tables,
    delivery_table,
    metadata,
    outbox_table,
    sweep_table,
    workflow_table,
)
from celery_outbox.sqlalchemy.types import UTCDateTime
from celery_outbox.store.records import DELIVERY_TABLE
from celery_outbox.store.schema import PENDING_TASK_INDEX

#: The folder of the outbox's Alembic revisions (branch label ``celery_outbox``): add it to
#: your ``version_locations`` and run ``alembic upgrade celery_outbox@head``.
ALEMBIC_VERSIONS: str = str(Path(__file__).parent / "alembic_versions")

__all__ = [
    "ALEMBIC_VERSIONS",
    "DELIVERY_TABLE",
    "PENDING_TASK_INDEX",
    "OutboxTables",
    "SQLAlchemyOutboxStore",
    "UTCDateTime",
    "atomic_session",
    "chord_join_table",
    "completed_table",
    "dead_letter_table",
    "define_tables",
    "delivery_table",
    "metadata",
    "outbox_table",
    "sweep_table",
    "workflow_table",
]
