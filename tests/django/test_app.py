"""The app itself: store installation, schema, migrations, settings, signals and checks."""

from __future__ import annotations

import io
from typing import Any

import pytest
from celery import Celery
from django.apps import apps
from django.core.management import call_command
from django.db import IntegrityError, connection, transaction

from celery_outbox import signals as core_signals
from celery_outbox.registry import store_for
from celery_outbox.store.records import DEAD_LETTER_TABLE, OUTBOX_TABLE, MessageStatus
from django_outbox import checks, signals
from django_outbox.models import DeadLetter, OutboxMessage
from django_outbox.settings import settings as outbox_settings
from django_outbox.store import DjangoOutboxStore


def test_ready_installs_the_orm_store_as_default() -> None:
    config = apps.get_app_config("django_outbox")
    assert (config.label, config.default_auto_field) == (
        "django_outbox",
        "django.db.models.BigAutoField",
    )
    assert isinstance(store_for(Celery("fresh", set_as_current=False)), DjangoOutboxStore)


def test_canvas_warnings_follow_debug(settings: Any) -> None:
    # the app's ready() points the development warning at settings.DEBUG
    from celery_outbox.workflows import checks as canvas_warnings

    settings.DEBUG = True
    assert canvas_warnings._enabled() is True
    settings.DEBUG = False
    assert canvas_warnings._enabled() is False


def test_models_use_the_shared_tables() -> None:
    assert OutboxMessage._meta.db_table == OUTBOX_TABLE
    assert DeadLetter._meta.db_table == DEAD_LETTER_TABLE
    codenames = {codename for codename, _ in DeadLetter._meta.permissions}
    assert codenames == {"requeue_deadletter", "discard_deadletter"}
    assert "view" in DeadLetter._meta.default_permissions


@pytest.mark.django_db
def test_database_has_the_shared_indexes() -> None:
    with connection.cursor() as cursor:
        found = {
            table: connection.introspection.get_constraints(cursor, table)
            for table in (OUTBOX_TABLE, DEAD_LETTER_TABLE)
        }
    assert found[OUTBOX_TABLE]["celery_outbox_due_idx"]["columns"] == ["status", "available_at"]
    assert found[OUTBOX_TABLE]["celery_outbox_task_id_idx"]["columns"] == ["task_id"]
    assert found[OUTBOX_TABLE]["celery_outbox_pending_task_uniq"]["unique"] is True
    assert found[DEAD_LETTER_TABLE]["celery_outbox_dl_status_failed_idx"]["columns"] == [
        "status",
        "failed_at",
    ]
    assert found[DEAD_LETTER_TABLE]["celery_outbox_dl_task_id_idx"]["columns"] == ["task_id"]


@pytest.mark.django_db
def test_partial_unique_index_allows_one_pending_row_per_task_id(message: Any) -> None:
    def row(status: str) -> OutboxMessage:
        return OutboxMessage.objects.create(
            task_id="t",
            task_name="n",
            payload="",
            options={},
            status=status,
            available_at=message().available_at,
        )

    row(MessageStatus.FAILED.value)
    row(MessageStatus.PUBLISHED.value)
    first = row(MessageStatus.PENDING.value)
    with pytest.raises(IntegrityError), transaction.atomic():
        row(MessageStatus.PENDING.value)
    assert str(first) == "n[t] (pending)"


@pytest.mark.django_db
def test_migrations_match_the_models() -> None:
    out = io.StringIO()
    call_command("makemigrations", "django_outbox", "--check", "--dry-run", stdout=out)
    assert "No changes detected" in out.getvalue()


def test_settings_are_read_lazily(settings: Any) -> None:
    assert list(outbox_settings.DATABASES) == ["default"]
    settings.DJANGO_OUTBOX_DATABASES = ["default", "other"]
    assert list(outbox_settings.DATABASES) == ["default", "other"]
    assert DjangoOutboxStore().sweep_aliases() == ["default", "other"]


def test_core_signals_are_resent_as_django_signals() -> None:
    received: list[dict[str, Any]] = []

    def receiver(sender: Any, **kwargs: Any) -> None:
        received.append({"sender": sender, **kwargs})

    signals.message_published.connect(receiver)
    try:
        signals.connect()  # idempotent: still one forward
        core_signals.message_published.send(sender="app", task_ids=["a", "b"])
    finally:
        signals.message_published.disconnect(receiver)
    assert received == [
        {"sender": "app", "signal": signals.message_published, "task_ids": ["a", "b"]}
    ]


@pytest.fixture
def celery_app() -> Any:
    """A Celery app made current for the checks (they read ``celery.current_app``)."""
    from celery import _state

    previous = _state.get_current_app()
    app = Celery("checks", set_as_current=True)
    yield app
    previous.set_current()


def ids(messages: list[Any]) -> list[str]:
    """The ids of check messages."""
    return [message.id for message in messages]


def test_valid_configuration_passes_every_check(celery_app: Celery) -> None:
    assert [message for check in checks.CHECKS for message in check()] == []


def test_invalid_outbox_setting_is_an_error_naming_it(celery_app: Celery) -> None:
    celery_app.conf.outbox_sweep_interval = -1
    errors = checks.check_outbox_settings()
    assert ids(errors) == ["django_outbox.E001"]
    assert "outbox_sweep_interval" in errors[0].msg


def test_pickle_serializer_is_a_warning_naming_the_setting(celery_app: Celery) -> None:
    celery_app.conf.task_serializer = "pickle"
    celery_app.conf.accept_content = ["json", "pickle"]
    warnings = checks.check_pickle()
    assert ids(warnings) == ["django_outbox.W001", "django_outbox.W001"]
    assert "CELERY_TASK_SERIALIZER" in warnings[0].msg
    assert "CELERY_ACCEPT_CONTENT" in warnings[1].msg


def test_unknown_database_alias_is_an_error(settings: Any) -> None:
    settings.DJANGO_OUTBOX_DATABASES = ["default", "nowhere"]
    errors = checks.check_databases()
    assert ids(errors) == ["django_outbox.E002"]
    assert "'nowhere'" in errors[0].msg
    settings.DJANGO_OUTBOX_DATABASES = "default"
    assert ids(checks.check_databases()) == ["django_outbox.E002"]


def test_use_tz_false_is_an_error(settings: Any) -> None:
    settings.USE_TZ = False
    assert ids(checks.check_use_tz()) == ["django_outbox.E003"]


def test_no_beat_entry_for_the_sweep_is_a_warning(celery_app: Celery) -> None:
    celery_app.conf.outbox_beat_schedule = False
    assert ids(checks.check_beat_entry()) == ["django_outbox.W002"]
    celery_app.conf.beat_schedule = {"sweep": {"task": checks.SWEEP_TASK, "schedule": 5.0}}
    assert checks.check_beat_entry() == []


def test_checks_run_through_django(celery_app: Celery, settings: Any) -> None:
    from django.core.checks import run_checks

    settings.DJANGO_OUTBOX_DATABASES = ["nowhere"]
    assert "django_outbox.E002" in ids(run_checks())


@pytest.mark.django_db
def test_skip_locked_check_warns_only_without_skip_locked() -> None:
    expected = (
        [] if connection.features.has_select_for_update_skip_locked else ["django_outbox.W003"]
    )
    assert ids(checks.check_skip_locked(databases=["default"])) == expected
    assert checks.check_skip_locked(databases=[]) == []
