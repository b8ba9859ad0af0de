"""The Django models and the SQLAlchemy tables describe the same tables.

One database can then be shared by a Django project and a SQLAlchemy service: same table
and column names, nullability, type family (and string lengths), and index names (with
the PostgreSQL expression indexes a migration builds outside the models).
"""

from __future__ import annotations

from typing import Any

import pytest

pytest.importorskip("sqlalchemy")
pytest.importorskip("django", reason="Django is not installed: no models to compare")

from sqlalchemy import JSON, DateTime, Integer, String, Table, Text
from sqlalchemy.types import TypeDecorator, TypeEngine

from celery_outbox.sqlalchemy import metadata
from celery_outbox.store.records import DEAD_LETTER_TABLE, OUTBOX_TABLE
from celery_outbox.store.schema import LETTER_ROOT_INDEX, PENDING_ROOT_INDEX

#: Expression indexes Django's migration 0011 builds on PostgreSQL, outside ``Meta.indexes``
#: (``celery_outbox.store.schema``; tests/django/admin/test_workflow_plans.py sees them built).
_MIGRATION_INDEXES = {
    OUTBOX_TABLE: {PENDING_ROOT_INDEX: ((), False)},
    DEAD_LETTER_TABLE: {LETTER_ROOT_INDEX: ((), False)},
}


def _models() -> dict[str, Any]:
    try:
        from django.apps import apps
    except ImportError:  # pragma: no cover - importorskip above
        pytest.skip("Django is not installed")
    if not apps.ready:
        pytest.skip("Django is not set up (run with pytest-django)")
    if not apps.is_installed("django_outbox"):
        pytest.skip("django_outbox is not in INSTALLED_APPS")
    models = apps.get_app_config("django_outbox").get_models()
    return {m._meta.db_table: m for m in models if not m._meta.proxy}  # a proxy has no table


def _sa_family(type_: TypeEngine[Any]) -> tuple[str, int | None]:
    if isinstance(type_, TypeDecorator):
        type_ = type_.impl_instance
    if isinstance(type_, DateTime):
        return "datetime", None
    if isinstance(type_, Integer):
        return "integer", None
    if isinstance(type_, Text):  # before String: Text is a String
        return "text", None
    if isinstance(type_, String):
        return "string", type_.length
    if isinstance(type_, JSON):
        return "json", None
    raise AssertionError(f"unmapped SQLAlchemy type {type_!r}")


_DJANGO_FAMILIES = {
    "BigAutoField": "integer",
    "AutoField": "integer",
    "BigIntegerField": "integer",
    "IntegerField": "integer",
    "PositiveIntegerField": "integer",
    "CharField": "string",
    "TextField": "text",
    "JSONField": "json",
    "DateTimeField": "datetime",
}


def _django_family(field: Any) -> tuple[str, int | None]:
    family = _DJANGO_FAMILIES[field.get_internal_type()]
    return family, field.max_length if family == "string" else None


def _django_columns(model: Any) -> dict[str, tuple[bool, tuple[str, int | None]]]:
    return {f.column: (f.null, _django_family(f)) for f in model._meta.concrete_fields}


def _sa_columns(table: Table) -> dict[str, tuple[bool, tuple[str, int | None]]]:
    return {c.name: (bool(c.nullable), _sa_family(c.type)) for c in table.columns}


def _django_indexes(model: Any) -> dict[str, tuple[tuple[str, ...], bool]]:
    meta = model._meta
    column = {f.name: f.column for f in meta.concrete_fields}
    found = {i.name: (tuple(column[f] for f in i.fields), False) for i in meta.indexes}
    for constraint in meta.constraints:
        found[constraint.name] = (tuple(column[f] for f in constraint.fields), True)
    return {**found, **_MIGRATION_INDEXES.get(meta.db_table, {})}


def _sa_indexes(table: Table) -> dict[str, tuple[tuple[str, ...], bool]]:
    return {str(i.name): (tuple(c.name for c in i.columns), bool(i.unique)) for i in table.indexes}


def _pairs() -> list[tuple[Any, Table]]:
    models = _models()
    pairs = [(models[name], table) for name, table in metadata.tables.items() if name in models]
    if not pairs:
        pytest.skip("django_outbox has no models for these tables yet")
    return pairs


def test_every_sqlalchemy_table_has_a_django_model() -> None:
    models = _models()
    missing = sorted(set(metadata.tables) - set(models))
    assert not missing, f"tables without a Django model: {missing}"


def test_columns_agree_on_names_nullability_and_types() -> None:
    for model, table in _pairs():
        assert _django_columns(model) == _sa_columns(table), table.name


def test_primary_keys_agree() -> None:
    for model, table in _pairs():
        assert [model._meta.pk.column] == [c.name for c in table.primary_key], table.name


def test_indexes_agree_on_names_columns_and_uniqueness() -> None:
    for model, table in _pairs():
        assert _django_indexes(model) == _sa_indexes(table), table.name
