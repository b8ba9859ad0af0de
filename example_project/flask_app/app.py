"""The Flask example: a shop whose receipts are Celery tasks dispatched through the outbox.

The outbox tables come from the package's Alembic revisions (``celery_outbox@head``), the
shop's own tables from ``db.create_all()``. The store reads Flask-SQLAlchemy's
``db.session`` (a ``scoped_session``): a ``delay()`` inside a request's transaction writes
its row in that transaction, published right after ``db.session.commit()``.

Defaults need no server: SQLite and a broker made of files under ``FLASK_EXAMPLE_VAR``
(``example_project/var/flask``). ``FLASK_EXAMPLE_DATABASE_URL`` and
``FLASK_EXAMPLE_BROKER_URL`` choose others (PostgreSQL and Redis in the tests), and
``FLASK_EXAMPLE_QUEUE`` the queue.

Serve it with ``flask --app example_project.flask_app.app run`` beside a worker,
``celery -A example_project.flask_app.app worker -B``; or run the whole story with
``python -m example_project.flask_app.run``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from alembic import command
from alembic.config import Config
from celery import Celery
from flask import Flask, abort, jsonify, request
from flask_sqlalchemy import SQLAlchemy
from sqlalchemy import ForeignKey, String
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column

from celery_outbox import OutboxTask
from celery_outbox.registry import install_store
from celery_outbox.sqlalchemy import ALEMBIC_VERSIONS, SQLAlchemyOutboxStore

VAR = Path(
    os.environ.get("FLASK_EXAMPLE_VAR") or Path(__file__).resolve().parent.parent / "var" / "flask"
)
for folder in ("broker", "beat", "migrations/versions"):
    (VAR / folder).mkdir(parents=True, exist_ok=True)

DATABASE_URL = os.environ.get("FLASK_EXAMPLE_DATABASE_URL") or f"sqlite:///{VAR / 'shop.sqlite3'}"
BROKER_URL = os.environ.get("FLASK_EXAMPLE_BROKER_URL") or "filesystem://"
QUEUE = os.environ.get("FLASK_EXAMPLE_QUEUE") or "celery"


class Base(DeclarativeBase):
    pass


db = SQLAlchemy(model_class=Base)


class Order(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "flask_shop_order"
    id: Mapped[int] = mapped_column(primary_key=True)
    customer: Mapped[str] = mapped_column(String(100))


class Receipt(db.Model):  # type: ignore[name-defined,misc]
    __tablename__ = "flask_shop_receipt"
    id: Mapped[int] = mapped_column(primary_key=True)
    order_id: Mapped[int] = mapped_column(ForeignKey("flask_shop_order.id"))


def migrate() -> None:
    """``alembic upgrade celery_outbox@head`` (the outbox's tables), then the shop's own."""
    scripts = VAR / "migrations"
    (scripts / "env.py").write_text(_ENV_PY)
    config = Config()
    config.set_main_option("script_location", str(scripts))
    config.set_main_option("path_separator", "os")
    config.set_main_option(
        "version_locations", os.pathsep.join([str(scripts / "versions"), ALEMBIC_VERSIONS])
    )
    config.set_main_option("sqlalchemy.url", DATABASE_URL.replace("%", "%%"))
    command.upgrade(config, "celery_outbox@head")
    db.create_all()


# The smallest env.py an application has: the outbox's revisions need no target metadata.
_ENV_PY = """
from alembic import context
from sqlalchemy import create_engine

engine = create_engine(context.config.get_main_option("sqlalchemy.url"))
with engine.connect() as connection:
    context.configure(connection=connection)
    with context.begin_transaction():
        context.run_migrations()
engine.dispose()
"""

flask_app = Flask(__name__)
flask_app.config["SQLALCHEMY_DATABASE_URI"] = DATABASE_URL
db.init_app(flask_app)

celery_app = Celery("flask_shop", broker=BROKER_URL, set_as_current=True)
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

with flask_app.app_context():
    migrate()
    # The store reads db.session: a dispatch joins the request's transaction.
    store = SQLAlchemyOutboxStore(engine=db.engine, scoped_session=db.session)
install_store(celery_app, store)


@celery_app.task(base=OutboxTask, name="flask_shop.send_receipt", max_retries=3)
def send_receipt(order_id: int) -> None:
    """'Email' the receipt: record it. The order is committed before this runs."""
    with flask_app.app_context():
        if db.session.get(Order, order_id) is None:
            raise LookupError(f"order {order_id} does not exist")
        db.session.add(Receipt(order_id=order_id))
        db.session.commit()


@flask_app.post("/orders")
def place_order() -> Any:
    """Write the order and dispatch its receipt in one transaction; ``?fail=1`` rolls back."""
    order = Order(customer=str((request.get_json(silent=True) or {}).get("customer", "")))
    db.session.add(order)
    db.session.flush()
    send_receipt.delay(order.id)  # an outbox row in this transaction
    if request.args.get("fail"):
        db.session.rollback()  # ... gone with the order: nothing is sent
        abort(409, description="the order was rolled back, and its receipt with it")
    db.session.commit()  # ... published right after this COMMIT
    return jsonify(id=order.id), 201


@flask_app.get("/receipts")
def receipts() -> Any:
    """The receipts sent so far."""
    return jsonify(order_ids=sorted(r.order_id for r in db.session.scalars(db.select(Receipt))))
