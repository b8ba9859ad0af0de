"""The Django store picks one strategy per database alias, from its vendor, once."""

from __future__ import annotations

from django.db import connections

from django_outbox.store.vendors import (
    MySQLStrategy,
    PostgreSQLStrategy,
    SQLiteStrategy,
    strategy_for,
)

#: The strategy each vendor the suite runs on must get.
EXPECTED = {"postgresql": PostgreSQLStrategy, "sqlite": SQLiteStrategy, "mysql": MySQLStrategy}


def test_each_alias_gets_its_vendors_strategy_once() -> None:
    for alias in ("default", "other"):
        chosen = strategy_for(alias)
        assert type(chosen) is EXPECTED[connections[alias].vendor]
        assert strategy_for(alias) is chosen
