"""The benchmark environment: the database, Django, and this run's Redis keys."""

from __future__ import annotations

import os
from typing import Any
from urllib.parse import urlsplit, urlunsplit

#: Redis keys of kombu's Redis transport that hold unacknowledged (e.g. ETA) messages.
UNACKED_KEYS = ("unacked", "unacked_index", "unacked_mutex")


def setup_django() -> None:
    """Create and migrate the benchmark database, then set Django up (idempotent)."""
    os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
    import django
    from django.conf import settings

    if settings.configured and getattr(setup_django, "done", False):
        return
    from benchmarks.settings import POSTGRES_URL

    create_database(POSTGRES_URL)
    django.setup()
    from django.core.management import call_command

    call_command("migrate", verbosity=0, interactive=False)
    setup_django.done = True  # type: ignore[attr-defined]


def create_database(url: str) -> None:
    """Create the database of ``url`` on its server when it does not exist."""
    import psycopg

    parts = urlsplit(url)
    name = parts.path.lstrip("/")
    admin = urlunsplit(parts._replace(path="/postgres"))
    with psycopg.connect(admin, autocommit=True, connect_timeout=5) as conn:
        exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,)).fetchone()
        if not exists:
            conn.execute(f'CREATE DATABASE "{name}"')


def reset_outbox() -> None:
    """Empty the outbox and dead-letter tables."""
    from django.db import connection

    from celery_outbox.store.records import DEAD_LETTER_TABLE, OUTBOX_TABLE

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {OUTBOX_TABLE}, {DEAD_LETTER_TABLE}")


def on_rabbitmq() -> bool:
    """Whether the broker of this run is RabbitMQ (``--broker amqp``)."""
    from benchmarks.app import BROKER_URL

    return BROKER_URL.startswith("amqp")


def purge_broker() -> None:
    """Empty this run's queue and delete its report keys (and, on Redis, the
    unacknowledged messages).
    """
    from benchmarks.app import QUEUE, reports

    client = reports()
    keys = [*client.scan_iter(match=f"{QUEUE}:*", count=1000)]
    if on_rabbitmq():
        _amqp_queue(purge=True)
    else:
        keys += [QUEUE, *UNACKED_KEYS]
    if keys:
        client.delete(*keys)


def queue_length() -> int:
    """Messages waiting in this run's queue."""
    from benchmarks.app import QUEUE, reports

    if on_rabbitmq():
        return _amqp_queue(purge=False)
    return int(reports().llen(QUEUE))


def _amqp_queue(*, purge: bool) -> int:
    """Declare this run's RabbitMQ queue as Celery does; its message count, or purge it."""
    from benchmarks.app import QUEUE, app

    queue = app.amqp.queues[QUEUE]
    with app.connection_for_write() as conn:
        bound = queue(conn.default_channel)
        bound.declare()
        if purge:
            return int(bound.purge() or 0)
        declared: Any = bound.queue_declare(passive=True)
        return int(declared.message_count)


def counter(name: str) -> int:
    """A report counter of this run (0 when unset)."""
    from benchmarks.app import key, reports

    return int(reports().get(key(name)) or 0)
