"""The FastAPI example through ``httpx.AsyncClient``, with a real worker, on PostgreSQL
(asyncpg for the API, psycopg for the store) and Redis.

The example's module reads its database, broker and queue from the environment when first
imported: this module sets them (a fresh PostgreSQL database, the shared Redis, a queue of
its own) before importing it, and the worker process gets the same environment.
"""

from __future__ import annotations

import asyncio
import importlib
import os
from collections.abc import Iterator
from types import ModuleType
from typing import Any

import pytest

pytest.importorskip("fastapi", reason="the FastAPI example needs the dev extra")
pytest.importorskip("asyncpg", reason="the FastAPI example needs the dev extra")

import httpx

from celery_outbox.store.records import MessageStatus
from tests import services
from tests.brokers import purge_queue
from tests.worker import WorkerCommand, WorkerProcess, start_worker, wait_for

APP_MODULE = "example_project.fastapi_app.app"


@pytest.fixture(scope="module")
def example_env(
    postgres_url: str, redis_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[dict[str, str]]:
    name = services.unique_name("outbox_fastapi_")
    services.create_postgres_database(postgres_url, name)
    env = {
        "FASTAPI_EXAMPLE_VAR": str(tmp_path_factory.mktemp("fastapi")),
        "FASTAPI_EXAMPLE_DATABASE_URL": services.with_db_name(postgres_url, name),
        "FASTAPI_EXAMPLE_BROKER_URL": redis_url,
        "FASTAPI_EXAMPLE_QUEUE": services.unique_name("fastapi_"),
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


#: One event loop for the module: the async engine's pooled connections belong to it.
LOOP = asyncio.new_event_loop()


@pytest.fixture(scope="module")
def example(example_env: dict[str, str]) -> Iterator[ModuleType]:
    module = importlib.import_module(APP_MODULE)
    yield module
    LOOP.run_until_complete(module.async_engine.dispose())
    LOOP.close()
    module.engine.dispose()


@pytest.fixture(scope="module")
def worker(
    example: ModuleType, example_env: dict[str, str], tmp_path_factory: pytest.TempPathFactory
) -> Iterator[WorkerProcess]:
    queue = example_env["FASTAPI_EXAMPLE_QUEUE"]
    command = WorkerCommand(app_module=APP_MODULE, queue=queue)
    log = tmp_path_factory.mktemp("fastapi-worker") / "worker.log"
    process = start_worker(command, env=example_env, log_path=log)
    yield process
    process.stop()
    purge_queue(example_env["FASTAPI_EXAMPLE_BROKER_URL"], queue)


def call(example: ModuleType, method: str, path: str, **kwargs: Any) -> httpx.Response:
    """One request to the API through ``httpx.AsyncClient``, on the module's loop."""

    async def request() -> httpx.Response:
        transport = httpx.ASGITransport(app=example.api)
        async with httpx.AsyncClient(transport=transport, base_url="http://shop") as client:
            return await client.request(method, path, **kwargs)

    return LOOP.run_until_complete(request())


def receipts(example: ModuleType) -> list[int]:
    response = call(example, "GET", "/receipts")
    assert response.status_code == 200
    return list(response.json()["order_ids"])


def test_a_committed_order_gets_its_receipt_once(
    example: ModuleType, worker: WorkerProcess
) -> None:
    placed = call(example, "POST", "/orders", json={"customer": "ada"})
    assert placed.status_code == 201
    order_id = placed.json()["id"]

    wait_for(lambda: order_id in receipts(example), timeout=30, what="the receipt")
    assert receipts(example).count(order_id) == 1, worker.log_text()


def test_a_rolled_back_order_sends_nothing(example: ModuleType, worker: WorkerProcess) -> None:
    before = receipts(example)
    refused = call(example, "POST", "/orders?fail=true", json={"customer": "mallory"})
    assert refused.status_code == 409
    placed = call(example, "POST", "/orders", json={"customer": "grace"}).json()["id"]

    # The order placed after it arrives; the rolled-back one never does.
    wait_for(lambda: placed in receipts(example), timeout=30, what="the later receipt")
    assert len(receipts(example)) == len(before) + 1
    wait_for(
        lambda: dict(example.store.count_by_status()).get(MessageStatus.PENDING, 0) == 0,
        timeout=10,
        what="no pending row",
    )
