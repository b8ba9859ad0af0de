"""The benchmark environment: the database, Django, and this run's Redis keys."""

from __future__ import annotations

import os
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

    from celery_outbox.records import DEAD_LETTER_TABLE, OUTBOX_TABLE

    with connection.cursor() as cursor:
        cursor.execute(f"TRUNCATE {OUTBOX_TABLE}, {DEAD_LETTER_TABLE}")


def purge_broker() -> None:
    """Delete this run's queue, its report keys and unacknowledged messages (Redis db 11)."""
    from benchmarks.app import QUEUE, reports

    client = reports()
    keys = [QUEUE, *UNACKED_KEYS, *client.scan_iter(match=f"{QUEUE}:*", count=1000)]
    client.delete(*keys)


def queue_length() -> int:
    """Messages waiting in this run's queue."""
    from benchmarks.app import QUEUE, reports

    return int(reports().llen(QUEUE))


def counter(name: str) -> int:
    """A report counter of this run (0 when unset)."""
    from benchmarks.app import key, reports

    return int(reports().get(key(name)) or 0)
