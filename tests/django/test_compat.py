"""Every Django and Celery internal in ``django_outbox._compat``, against the installed
versions: when an upgrade changes one, this fails naming it (not production).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable

import celery
import django
import pytest
from celery import _state as celery_state
from django.db import connection, transaction
from django.db.models import QuerySet

from django_outbox import _compat
from django_outbox.models import OutboxMessage
from tests.django.admin_app import make_letter
from tests.django.helpers import new_savepoint

VERSIONS = f"Django {django.__version__}, Celery {celery.__version__}"


def test_queryset_raw_delete_still_takes_an_alias() -> None:
    raw_delete = getattr(QuerySet, "_raw_delete", None)
    assert raw_delete is not None, f"QuerySet._raw_delete is gone in {VERSIONS}"
    parameters = list(inspect.signature(raw_delete).parameters)
    assert parameters[:2] == ["self", "using"], (
        f"QuerySet._raw_delete{inspect.signature(raw_delete)} changed in {VERSIONS}"
    )


@pytest.mark.django_db
def test_raw_delete_deletes_and_counts() -> None:
    letter = make_letter()
    assert _compat.raw_delete(type(letter).objects.filter(pk=letter.pk), "default") == 1
    assert not type(letter).objects.filter(pk=letter.pk).exists()


def register_then_roll_back(callback: Callable[[], None]) -> None:
    """Register ``callback`` in a savepoint that rolls back."""
    with transaction.atomic():
        transaction.on_commit(callback)
        raise RuntimeError


@pytest.mark.django_db
def test_run_on_commit_still_lists_the_registered_callables() -> None:
    def callback() -> None: ...

    with transaction.atomic():
        transaction.on_commit(callback)
        entries = getattr(connection, "run_on_commit", None)
        assert isinstance(entries, list), f"connection.run_on_commit changed in {VERSIONS}"
        assert all(isinstance(entry, tuple) and len(entry) == 3 for entry in entries), (
            f"connection.run_on_commit entries are not (sids, callable, robust) in {VERSIONS}"
        )
        assert callback in _compat.on_commit_callbacks(connection)
        with pytest.raises(RuntimeError):
            register_then_roll_back(callback)
        assert _compat.on_commit_callbacks(connection).count(callback) == 1


@pytest.mark.django_db
def test_model_state_still_records_the_alias() -> None:
    row = OutboxMessage.objects.using("default").first() or make_letter()
    assert getattr(getattr(row, "_state", None), "db", None) == "default", (
        f"Model._state.db changed in {VERSIONS}"
    )
    assert _compat.instance_alias(row) == "default"


def test_celery_state_still_holds_the_current_and_default_app() -> None:
    assert hasattr(celery_state, "_tls"), f"celery._state._tls is gone in {VERSIONS}"
    assert hasattr(celery_state._tls, "current_app"), (
        f"celery._state._tls.current_app is gone in {VERSIONS}"
    )
    assert hasattr(celery_state, "default_app"), f"celery._state.default_app is gone in {VERSIONS}"
    previous = celery_state._tls.current_app
    app = celery.Celery("compat-probe", set_as_current=True)
    try:
        assert _compat.created_celery_app() is app
    finally:
        celery_state._set_current_app(previous)
        app.close()


@pytest.mark.django_db(transaction=True)
def test_savepoint_rollbacks_still_run_through_the_execute_wrappers() -> None:
    wrappers = getattr(connection, "execute_wrappers", None)
    assert isinstance(wrappers, list), f"connection.execute_wrappers changed in {VERSIONS}"
    seen: list[str] = []

    def wrapper(execute: Callable[..., object], sql: str, *args: object) -> object:
        seen.append(sql)
        return execute(sql, *args)

    _compat.add_execute_wrapper(connection, wrapper)
    try:
        with transaction.atomic():
            with pytest.raises(RuntimeError):
                register_then_roll_back(lambda: None)
            sid = new_savepoint()
            transaction.savepoint_rollback(sid)
        assert connection.execute_wrappers[0] is wrapper
    finally:
        connection.execute_wrappers.remove(wrapper)
    rollbacks = [sql for sql in seen if sql.startswith("ROLLBACK TO SAVEPOINT")]
    assert len(rollbacks) == 2, (
        f"Django's savepoint rollbacks no longer go through connection.execute_wrappers in "
        f"{VERSIONS} (django_outbox.store.transactions would miss them): saw {seen}"
    )


@pytest.mark.django_db
def test_new_connection_is_a_driver_connection_django_does_not_manage() -> None:
    made = _compat.new_connection("default")
    try:
        assert made is not connection.connection
        assert type(made).__module__.split(".")[0] == connection.Database.__name__.split(".")[0]
        cursor = made.cursor()
        cursor.execute("SELECT 1")
        assert cursor.fetchall() == [(1,)]
        cursor.close()
    finally:
        made.close()
