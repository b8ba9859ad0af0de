"""The MySQL/MariaDB key over pending task ids: its DDL and how its duplicate error is told."""

from __future__ import annotations

import importlib

from celery_outbox.store.schema import (
    PENDING_TASK_INDEX,
    is_pending_duplicate,
    mysql_add_pending_key,
    mysql_drop_pending_key,
)


class _DriverError(Exception):
    pass


class _Wrapper(Exception):
    def __init__(self, orig: BaseException) -> None:
        super().__init__("wrapped")
        self.orig = orig


def test_the_duplicate_key_error_on_the_pending_key_is_told_through_wrappers() -> None:
    driver = _DriverError(1062, f"Duplicate entry 'x' for key '{PENDING_TASK_INDEX}'")
    assert is_pending_duplicate(driver)
    assert is_pending_duplicate(_Wrapper(driver))
    chained = RuntimeError("store")
    chained.__cause__ = _Wrapper(driver)
    assert is_pending_duplicate(chained)


def test_other_errors_are_not_the_pending_duplicate() -> None:
    assert not is_pending_duplicate(_DriverError(1062, "Duplicate entry '1' for key 'PRIMARY'"))
    assert not is_pending_duplicate(_DriverError(1213, f"Deadlock ... {PENDING_TASK_INDEX}"))
    assert not is_pending_duplicate(_DriverError("no code"))
    looped = RuntimeError("loop")
    looped.__cause__ = looped
    assert not is_pending_duplicate(looped)


def test_the_ddl_adds_and_drops_a_generated_column_with_its_unique_key() -> None:
    add = mysql_add_pending_key("t")
    assert add.startswith("ALTER TABLE t ADD COLUMN pending_task_id varchar(255) GENERATED")
    assert "CASE WHEN status = 'pending' THEN task_id END" in add
    assert f"ADD UNIQUE INDEX {PENDING_TASK_INDEX} (pending_task_id)" in add
    assert mysql_drop_pending_key("t") == (
        f"ALTER TABLE t DROP INDEX {PENDING_TASK_INDEX}, DROP COLUMN pending_task_id"
    )


def test_the_django_migration_carries_the_same_ddl() -> None:
    # Skipped nowhere: the migration module imports only django.db.migrations.
    migration = importlib.import_module("django_outbox.migrations.0009_mysql_pending_task_key")
    assert mysql_add_pending_key() == migration.ADD_KEY
    assert mysql_drop_pending_key() == migration.DROP_KEY
