"""The Celery app, the database and the outbox store of the SQLAlchemy example.

Everything lives under ``SQLA_EXAMPLE_VAR`` (default ``example_project/var/sqlalchemy``):
the SQLite database and a broker made of files, so no server is needed. The worker runs
``celery -A example_project.sqlalchemy_app.app worker -B``; the embedded beat runs the
outbox sweep that publishes rows a crashed process left behind.
"""

from __future__ import annotations

import os
from pathlib import Path

from celery import Celery
from sqlalchemy import ForeignKey, String, create_engine, event
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column, sessionmaker

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, define_tables

VAR = Path(
    os.environ.get("SQLA_EXAMPLE_VAR")
    or Path(__file__).resolve().parent.parent / "var" / "sqlalchemy"
)
for folder in ("broker", "beat"):
    (VAR / folder).mkdir(parents=True, exist_ok=True)


class Base(DeclarativeBase):
    pass


# The outbox tables live on the application's own MetaData, next to its models, so
# ``Base.metadata.create_all`` (or Alembic's autogenerate) covers them too.
outbox_tables = define_tables(Base.metadata)


class Order(Base):
    __tablename__ = "shop_order"
    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(100))


class Receipt(Base):
    __tablename__ = "shop_receipt"
    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int] = mapped_column(ForeignKey("shop_order.id"))


engine = create_engine(f"sqlite:///{VAR / 'shop.sqlite3'}", connect_args={"timeout": 30})


@event.listens_for(engine, "connect")
def _wal(dbapi_connection: object, _record: object) -> None:
    # WAL lets the worker read while the shop writes.
    dbapi_connection.execute("PRAGMA journal_mode=WAL")  # type: ignore[attr-defined]


SessionLocal = sessionmaker(engine)
Base.metadata.create_all(engine)

app = Celery("sqlalchemy_shop", broker="filesystem://", set_as_current=True)
app.conf.update(
    broker_transport_options={
        "data_folder_in": str(VAR / "broker"),
        "data_folder_out": str(VAR / "broker"),
    },
    beat_schedule_filename=str(VAR / "beat" / "schedule"),
    broker_connection_retry_on_startup=True,
    outbox_sweep_interval=2.0,
    outbox_publish_grace=2.0,
)
store = SQLAlchemyOutboxStore(engine=engine, tables=outbox_tables)
install_store(app, store)


@app.task(base=OutboxTask, name="shop.send_receipt", max_retries=3)
def send_receipt(order_id: int) -> None:
    """'Email' the receipt: record it. The order is committed before this runs."""
    with SessionLocal.begin() as session:
        order = session.get(Order, order_id)
        if order is None:
            raise LookupError(f"order {order_id} does not exist")
        session.add(Receipt(order_id=order_id))
