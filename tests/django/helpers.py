"""Helpers of the Django tests: rolled-back blocks, times, and database URLs."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timedelta
from urllib.parse import quote

import pytest
from django.db import connections, transaction

from tests.conftest import django_db_is_postgres

#: For behaviour only a server database shows (row locks, length limits, isolation
#: between connections): the suite's SQLite mode has none of them.
postgres_only = pytest.mark.skipif(
    not django_db_is_postgres(), reason="needs the PostgreSQL test database"
)


class Rollback(Exception):
    """Raised to roll an ``atomic`` block back."""


@contextmanager
def rolled_back(using: str = "default") -> Iterator[None]:
    """An ``atomic`` block (a savepoint when nested) that rolls back at its end.

    Other exceptions propagate; the block must reach its end for the test to go on.
    """
    reached_end = False
    try:
        with transaction.atomic(using=using):
            yield
            reached_end = True
            raise Rollback
    except Rollback:
        if not reached_end:
            raise
    assert reached_end


def later(now: datetime, seconds: float) -> datetime:
    """``now`` plus ``seconds``."""
    return now + timedelta(seconds=seconds)


def database_url(alias: str = "default") -> str:
    """The URL of the (test) database Django uses for ``alias`` right now."""
    params = connections[alias].settings_dict
    if params["ENGINE"].endswith("sqlite3"):
        return f"sqlite:///{params['NAME']}"
    scheme = "mysql" if params["ENGINE"].endswith("mysql") else "postgresql"
    user = quote(params.get("USER") or "")
    password = f":{quote(params['PASSWORD'])}" if params.get("PASSWORD") else ""
    host = params.get("HOST") or "127.0.0.1"
    port = f":{params['PORT']}" if params.get("PORT") else ""
    return f"{scheme}://{user}{password}@{host}{port}/{params['NAME']}"


def new_savepoint(using: str | None = None) -> str:
    """``transaction.savepoint_create()`` (Django 6.1+; ``savepoint()`` is deprecated
    there), else ``transaction.savepoint()``: the id of a new savepoint.
    """
    from django.db import transaction

    create = getattr(transaction, "savepoint_create", None) or transaction.savepoint
    return str(create(using=using))
