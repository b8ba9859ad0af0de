"""The app ``celery -A tests.integration.console_app outbox ...`` runs on: the SQLAlchemy
store on ``OUTBOX_CONSOLE_DB`` (an SQLAlchemy URL), the broker ``OUTBOX_CONSOLE_BROKER`` and
the queue ``OUTBOX_CONSOLE_QUEUE``. No tables are created here: the test creates them.
"""

from __future__ import annotations

import os

from celery import Celery
from sqlalchemy import create_engine

from celery_outbox.registry import install_store
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore

app = Celery("console_app", broker=os.environ["OUTBOX_CONSOLE_BROKER"], set_as_current=False)
app.conf.update(
    task_default_queue=os.environ["OUTBOX_CONSOLE_QUEUE"],
    broker_connection_retry_on_startup=True,
    outbox_publish_timeout=2.0,
    outbox_publish_grace=0.5,  # a row the tests leave is the sweep's after half a second
)
install_store(app, SQLAlchemyOutboxStore(engine=create_engine(os.environ["OUTBOX_CONSOLE_DB"])))


@app.task(name="console_app.echo")
def echo(n: int) -> int:
    """The task of the rows the tests leave for the sweep (never run: they read the queue)."""
    return n
