"""``outbox_store`` pointing at a factory of the SQLAlchemy store, on a real PostgreSQL.

Before: the loader called the factory with no argument, so the documented
``make_store(app)`` never worked, and no way to name the SQLAlchemy store in the setting did.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

import pytest
from celery import Celery
from sqlalchemy import create_engine, func, select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session

from celery_outbox import OutboxConfigError, OutboxTask
from celery_outbox.registry import store_for
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, metadata, outbox_table
from celery_outbox.state import reset, state_of

FACTORY = "tests.integration.store_factory.make_store"


@pytest.fixture
def database_url(postgres_database_url: str) -> str:
    url = make_url(postgres_database_url).set(drivername="postgresql+psycopg")
    rendered = url.render_as_string(hide_password=False)
    engine = create_engine(rendered)
    metadata.create_all(engine)
    engine.dispose()
    return rendered


@pytest.fixture
def app(database_url: str, redis_url: str) -> Iterator[Celery]:
    app = Celery("store-setting", broker=redis_url, set_as_current=False)
    app.conf.update(database_url=database_url, outbox_store=FACTORY)
    yield app
    store = state_of(app).store  # the one the setting built, if any
    reset(app)
    if isinstance(store, SQLAlchemyOutboxStore):
        store.engine.dispose()
    app.close()


def test_the_setting_builds_the_sqlalchemy_store_from_a_factory(app: Celery) -> None:
    store = store_for(app)
    assert isinstance(store, SQLAlchemyOutboxStore)
    assert store.engine.url.render_as_string(hide_password=False) == app.conf.database_url


def test_a_dispatch_writes_its_row_in_the_bound_session(app: Celery) -> None:
    @app.task(base=OutboxTask, name="store_setting.work", shared=False)
    def work(n: int) -> int:
        return n

    store = store_for(app)
    assert isinstance(store, SQLAlchemyOutboxStore)
    count = select(func.count()).select_from(outbox_table)
    with Session(store.engine) as session, store.bind_session(session):
        work.delay(1)
        assert session.execute(count).scalar_one() == 1  # in this transaction
        session.rollback()
    with store.engine.connect() as conn:
        assert conn.execute(count).scalar_one() == 0  # gone with the rollback


def test_the_store_class_alone_is_a_config_error_naming_the_setting(app: Celery) -> None:
    app.conf.outbox_store = "celery_outbox.sqlalchemy.SQLAlchemyOutboxStore"
    path = "outbox_store='celery_outbox.sqlalchemy.SQLAlchemyOutboxStore'"
    with pytest.raises(OutboxConfigError, match=re.escape(path)) as caught:
        store_for(app)
    assert isinstance(caught.value.__cause__, TypeError)  # its missing engine, chained
