"""The Flask example through Flask's test client, with a real worker, on PostgreSQL and Redis.

The example's module reads its database, broker and queue from the environment when first
imported: this module sets them (a fresh PostgreSQL database, the shared Redis, a queue of
its own) before importing it, and the worker process gets the same environment.
"""

from __future__ import annotations

import importlib
import os
from collections.abc import Iterator
from types import ModuleType

import pytest

pytest.importorskip("flask_sqlalchemy", reason="the Flask example needs the dev extra")
pytest.importorskip("alembic", reason="the Flask example needs the dev extra")

from sqlalchemy import create_engine, inspect
from sqlalchemy.engine import make_url

from celery_outbox.sqlalchemy import metadata
from celery_outbox.store.records import MessageStatus
from tests import services
from tests.brokers import purge_queue
from tests.worker import WorkerCommand, WorkerProcess, start_worker, wait_for

APP_MODULE = "example_project.flask_app.app"


@pytest.fixture(scope="module")
def example_env(
    postgres_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    name = services.unique_name("outbox_flask_")
    services.create_postgres_database(postgres_url, name)
    url = make_url(services.with_db_name(postgres_url, name)).set(drivername="postgresql+psycopg")
    env = {
        "FLASK_EXAMPLE_VAR": str(tmp_path_factory.mktemp("flask")),
        "FLASK_EXAMPLE_DATABASE_URL": url.render_as_string(hide_password=False),
        "FLASK_EXAMPLE_BROKER_URL": redis_url,
        "FLASK_EXAMPLE_QUEUE": services.unique_name("flask_"),
    }
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield env
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        services.drop_postgres_database(postgres_url, name)


@pytest.fixture(scope="module")
def example(example_env: dict[str, str]) -> Iterator[ModuleType]:
    module = importlib.import_module(APP_MODULE)
    yield module
    with module.flask_app.app_context():
        module.db.session.remove()
        module.db.engine.dispose()


@pytest.fixture(scope="module")
def worker(
    example: ModuleType, example_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    queue = example_env["FLASK_EXAMPLE_QUEUE"]
    command = WorkerCommand(app_module=APP_MODULE, queue=queue)
    log = tmp_path_factory.mktemp("flask-worker") / "worker.log"
    process = start_worker(command, env=example_env, log_path=log)
    yield process
    process.stop()
    purge_queue(example_env["FLASK_EXAMPLE_BROKER_URL"], queue)


def receipts(example: ModuleType) -> list[int]:
    response = example.flask_app.test_client().get("/receipts")
    assert response.status_code == 200
    return list(response.get_json()["order_ids"])


def test_the_alembic_revisions_built_the_outbox_tables(example: ModuleType) -> None:
    engine = create_engine(os.environ["FLASK_EXAMPLE_DATABASE_URL"])
    try:
        tables = set(inspect(engine).get_table_names())
    finally:
        engine.dispose()
    assert set(metadata.tables) <= tables
    assert {"alembic_version", "flask_shop_order", "flask_shop_receipt"} <= tables


def test_a_committed_order_gets_its_receipt_once(
    example: ModuleType, worker: WorkerProcess
) -> None:
    client = example.flask_app.test_client()
    placed = client.post("/orders", json={"customer": "ada"})
    assert placed.status_code == 201
    order_id = placed.get_json()["id"]

    wait_for(lambda: order_id in receipts(example), timeout=30, what="the receipt")
    assert receipts(example).count(order_id) == 1, worker.log_text()


def test_a_rolled_back_order_sends_nothing(example: ModuleType, worker: WorkerProcess) -> None:
    client = example.flask_app.test_client()
    before = receipts(example)
    refused = client.post("/orders?fail=1", json={"customer": "mallory"})
    assert refused.status_code == 409
    placed = client.post("/orders", json={"customer": "grace"}).get_json()["id"]

    # The order placed after it arrives; the rolled-back one never does.
    wait_for(lambda: placed in receipts(example), timeout=30, what="the later receipt")
    assert len(receipts(example)) == len(before) + 1
    assert dict(example.store.count_by_status()).get(MessageStatus.PENDING, 0) == 0
