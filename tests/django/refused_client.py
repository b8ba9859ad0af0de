"""Values the database refuses for their size, through the Django store's error boundary.

Run as ``python -m tests.django.refused_client`` on ``tests.django.db_settings`` (the
database ``OUTBOX_DJANGO_DB_URL``, migrated). Prints JSON: what the refusing statement
raised (the class name and its driver's code) and whether the next statement worked.
"""

from __future__ import annotations

import json
import os
import sqlite3
from typing import Any

import django

os.environ["DJANGO_SETTINGS_MODULE"] = "tests.django.db_settings"
django.setup()

from django.db import connection  # noqa: E402  (after django.setup)

from celery_outbox.exceptions import StoreError  # noqa: E402
from django_outbox.store import DjangoOutboxStore  # noqa: E402
from django_outbox.store.calls import store_errors  # noqa: E402
from tests.contract.factories import new_dead_letter  # noqa: E402

#: A statement each server refuses for the size of a value, cheaply.
REFUSING = {
    # 1301: the result is over max_allowed_packet (an error in strict mode).
    "mysql": "INSERT INTO refused VALUES (REPEAT('x', @@max_allowed_packet + 1))",
    # SQLSTATE 54000 program_limit_exceeded: checked before anything is allocated.
    "postgresql": "SELECT repeat('x', 1073741824)",
}


def code_of(error: Any) -> Any:
    """A driver error's code: MySQL's number, PostgreSQL's SQLSTATE, else its message."""
    args = getattr(error, "args", ())
    if args and isinstance(args[0], int):
        return args[0]
    return getattr(error, "sqlstate", None) or str(error)


def refuse() -> None:
    """Run the vendor's refusing statement; on SQLite write a letter over its length
    limit through the store (``SQLITE_LIMIT_LENGTH``, lowered on this connection).
    """
    if connection.vendor == "sqlite":
        connection.ensure_connection()
        connection.connection.setlimit(sqlite3.SQLITE_LIMIT_LENGTH, 10_000)
        DjangoOutboxStore().add_dead_letter(new_dead_letter(exception_message="x" * 20_000))
        return
    with store_errors("write a value"), connection.cursor() as cursor:
        if connection.vendor == "mysql":
            cursor.execute("CREATE TEMPORARY TABLE refused (v LONGTEXT)")
        cursor.execute(REFUSING[connection.vendor])


def main() -> None:
    outcome: dict[str, Any] = {"vendor": connection.vendor}
    try:
        refuse()
    except StoreError as exc:
        cause = exc.__cause__.__cause__ if exc.__cause__ is not None else None
        outcome["error"] = type(exc).__name__
        outcome["cause"] = type(cause).__name__
        outcome["code"] = code_of(cause)
    store = DjangoOutboxStore()
    outcome["then"] = store.get_dead_letter(store.add_dead_letter(new_dead_letter())) is not None
    print(json.dumps(outcome))


if __name__ == "__main__":
    main()
