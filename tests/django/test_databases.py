"""The Django test databases are the ones the settings promise, both aliases."""

from __future__ import annotations

import pytest
from django.db import connections

from tests.conftest import django_db_is_postgres

EXPECTED_VENDOR = "postgresql" if django_db_is_postgres() else "sqlite"


@pytest.mark.django_db(databases=["default", "other"])
@pytest.mark.parametrize("alias", ["default", "other"])
def test_each_alias_is_its_own_test_database(alias: str) -> None:
    connection = connections[alias]

    with connection.cursor() as cursor:
        cursor.execute("SELECT 1")
        assert cursor.fetchone() == (1,)
    assert connection.vendor == EXPECTED_VENDOR
    assert (
        connection.settings_dict["NAME"]
        != connections["default" if alias == "other" else "other"].settings_dict["NAME"]
    )


@pytest.mark.django_db
def test_a_database_test_is_marked_postgres(request: pytest.FixtureRequest) -> None:
    marked = request.node.get_closest_marker("postgres") is not None

    assert marked is django_db_is_postgres()


def test_a_test_without_the_database_is_not_marked(request: pytest.FixtureRequest) -> None:
    assert request.node.get_closest_marker("postgres") is None
