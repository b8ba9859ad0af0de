"""The FastAPI example: the shop as an async API on async SQLAlchemy.

A request writes its order through an ``AsyncSession`` bound to the outbox store and
dispatches the receipt with ``await send_receipt.adelay(...)``: the outbox row is written in
the session's transaction, and after ``await session.commit()`` it is published off the
event loop (a broker that is down or slow costs the loop nothing). A rollback sends nothing.

Both engines come from one URL: the API's async engine (aiosqlite, asyncpg) and the store's
sync one (sqlite3, psycopg), which the worker, the sweeper and the relay use.

Defaults need no server: SQLite and a broker made of files under ``FASTAPI_EXAMPLE_VAR``
(``example_project/var/fastapi``). ``FASTAPI_EXAMPLE_DATABASE_URL`` (a plain URL such as
``postgresql://postgres@127.0.0.1/shop``), ``FASTAPI_EXAMPLE_BROKER_URL`` and
``FASTAPI_EXAMPLE_QUEUE`` choose others. Serve it with
``uvicorn example_project.fastapi_app.app:api`` beside a worker,
``celery -A example_project.fastapi_app.app worker -B``; or run the whole story with
``python -m example_project.fastapi_app.run``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from celery import Celery
from fastapi import FastAPI, HTTPException
from pydantic import BaseModel
from sqlalchemy import ForeignKey, String, create_engine, select
from sqlalchemy.engine import make_url
from sqlalchemy.ext.asyncio import async_sessionmaker, create_async_engine
from sqlalchemy.orm import DeclarativeBase, Mapped, Session, mapped_column

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, define_tables

VAR = Path(
    os.environ.get("FASTAPI_EXAMPLE_VAR")
    or Path(__file__).resolve().parent.parent / "var" / "fastapi"
)
for folder in ("broker", "beat"):
    (VAR / folder).mkdir(parents=True, exist_ok=True)

URL = make_url(
    os.environ.get("FASTAPI_EXAMPLE_DATABASE_URL") or f"sqlite:///{VAR / 'shop.sqlite3'}"
)
BROKER_URL = os.environ.get("FASTAPI_EXAMPLE_BROKER_URL") or "filesystem://"
QUEUE = os.environ.get("FASTAPI_EXAMPLE_QUEUE") or "celery"

#: The async driver the API uses and the sync one the store uses, for each database.
DRIVERS = {
    "sqlite": ("sqlite+aiosqlite", "sqlite+pysqlite"),
    "postgresql": ("postgresql+asyncpg", "postgresql+psycopg"),
    "mysql": ("mysql+aiomysql", "mysql+pymysql"),
}
async_driver, sync_driver = DRIVERS[URL.get_backend_name()]


class Base(DeclarativeBase):
    pass


outbox_tables = define_tables(Base.metadata)


class Order(Base):
    __tablename__ = "api_shop_order"
    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(100))


class Receipt(Base):
    __tablename__ = "api_shop_receipt"
    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int] = mapped_column(ForeignKey("api_shop_order.id"))


# One URL, two engines: the store's sync engine, the API's async one.
engine = create_engine(URL.set(drivername=sync_driver))
async_engine = create_async_engine(URL.set(drivername=async_driver))
Sessions = async_sessionmaker(async_engine, expire_on_commit=False)
Base.metadata.create_all(engine)  # or the shipped Alembic revisions (docs/sqlalchemy.md)

celery_app = Celery("api_shop", broker=BROKER_URL, set_as_current=True)
celery_app.conf.update(
    broker_transport_options={
        "data_folder_in": str(VAR / "broker"),
        "data_folder_out": str(VAR / "broker"),
    },
    beat_schedule_filename=str(VAR / "beat" / "schedule"),
    broker_connection_retry_on_startup=True,
    task_default_queue=QUEUE,
    outbox_sweep_interval=2.0,
    outbox_publish_grace=2.0,
)
store = SQLAlchemyOutboxStore(engine=engine, tables=outbox_tables)
install_store(celery_app, store)


@celery_app.task(base=OutboxTask, name="api_shop.send_receipt", max_retries=3)
def send_receipt(order_id: int) -> None:
    """'Email' the receipt: record it (in the worker: sync code, the sync engine)."""
    with Session(engine) as session, session.begin():
        if session.get(Order, order_id) is None:
            raise LookupError(f"order {order_id} does not exist")
        session.add(Receipt(order_id=order_id))


api = FastAPI(title="celery-outbox shop")


class NewOrder(BaseModel):
    customer: str


@api.post("/orders", status_code=201)
async def place_order(new: NewOrder, fail: bool = False) -> dict[str, Any]:
    """Write the order and dispatch its receipt in one transaction; ``?fail=true`` rolls back."""
    async with Sessions() as session:
        with store.bind_session(session):
            order = Order(customer=new.customer)
            session.add(order)
            await session.flush()
            await send_receipt.adelay(order.id)  # an outbox row in this transaction
            if fail:
                await session.rollback()  # ... gone with the order: nothing is sent
                raise HTTPException(409, "the order was rolled back, and its receipt with it")
            await session.commit()  # ... published right after, off the event loop
            return {"id": order.id}


@api.get("/receipts")
async def receipts() -> dict[str, list[int]]:
    """The receipts sent so far."""
    async with Sessions() as session:
        found = await session.scalars(select(Receipt.order_id).order_by(Receipt.order_id))
        return {"order_ids": list(found)}
