"""Every Django and Celery internal ``django_outbox`` leans on, in one place.

None of these is public API: an upgrade may rename or reshape them.
``tests/django/test_compat.py`` checks each one against the installed versions and fails
naming the internal that changed, so an upgrade breaks that test, not production.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from celery import Celery
from celery import _state as celery_state
from django.db import DEFAULT_DB_ALIAS, connections
from django.db.models import Model, QuerySet


def raw_delete(rows: QuerySet[Any], alias: str) -> int:
    """``DELETE`` ``rows`` in one statement (``QuerySet._raw_delete``).

    Not ``.delete()``: with any delete signal receiver connected, Django would ``SELECT``
    the rows first and delete them one collection at a time.
    """
    return int(rows._raw_delete(alias))


def on_commit_callbacks(connection: Any) -> list[Callable[[], Any]]:
    """The callables Django will still run when ``connection`` commits
    (``connection.run_on_commit``: ``(savepoint ids, callable, robust)`` entries).
    """
    return [entry[1] for entry in connection.run_on_commit]


def add_execute_wrapper(connection: Any, wrapper: Callable[..., Any]) -> None:
    """Wrap every statement ``connection`` executes from now on with ``wrapper``
    (``connection.execute_wrappers``, which ``connection.execute_wrapper()`` only
    manages for the length of a block).

    First in the list, so that a user's ``execute_wrapper()`` block open now, whose exit
    pops the list's last entry, still removes its own wrapper.
    """
    connection.execute_wrappers.insert(0, wrapper)


def instance_alias(instance: Model) -> str:
    """The database alias ``instance`` was read from or saved to (``instance._state.db``)."""
    return instance._state.db or DEFAULT_DB_ALIAS


def created_celery_app() -> Celery | None:
    """The current (or else default) Celery app, without making a fallback app when none
    exists (``celery._state._tls.current_app`` and ``celery._state.default_app``).
    """
    # celery-types does not declare these module attributes of ``celery._state``.
    current: Celery | None = celery_state._tls.current_app  # type: ignore[attr-defined]
    default: Celery | None = celery_state.default_app  # type: ignore[attr-defined]
    return current or default


def new_connection(alias: str) -> Any:
    """A new DB-API connection to database ``alias``, made as Django makes its own but
    left to the caller (``connection.Database.connect(**connection.get_connection_params())``:
    the driver module and the keyword arguments Django builds from ``DATABASES``, without
    its pool).
    """
    wrapper: Any = connections[alias]
    return wrapper.Database.connect(**wrapper.get_connection_params())
