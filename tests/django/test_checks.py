"""``manage.py check`` on bad outbox configuration: every bad setting, with its range, at once."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from celery import Celery
from django.core.checks import run_checks
from django.core.management import call_command
from django.core.management.base import SystemCheckError

from django_outbox import checks


@pytest.fixture
def celery_app() -> Iterator[Celery]:
    """A Celery app made current for the checks (they read ``celery.current_app``)."""
    from celery import _state

    previous = _state.get_current_app()
    app = Celery("checks", set_as_current=True)
    yield app
    previous.set_current()


def outbox_errors() -> dict[str, list[str]]:
    """The messages of every ``django_outbox`` check, by id."""
    found: dict[str, list[str]] = {}
    for message in run_checks():
        if message.id and message.id.startswith("django_outbox."):
            found.setdefault(message.id, []).append(message.msg)
    return found


def test_manage_py_check_reports_every_bad_setting_with_its_range(celery_app: Celery) -> None:
    # 1e300 crashed the check itself (OverflowError); 1e-9 s and 1e13 s passed it.
    celery_app.conf.outbox_claim_lease = 1e300
    celery_app.conf.outbox_sweep_interval = 1e-9
    celery_app.conf.outbox_keep_published = 1e13
    celery_app.conf.outbox_sweep_batch_size = 0
    celery_app.conf.outbox_retry_queue = ""
    with pytest.raises(SystemCheckError) as caught:
        call_command("check")
    report = str(caught.value)
    for expected in (
        "outbox_claim_lease=1e+300 is not accepted: give 1 to 86400 seconds.",
        "outbox_sweep_interval=1e-09 is not accepted: give 0.1 to 86400 seconds.",
        "outbox_keep_published=10000000000000.0 is not accepted: give 0, or 0.001 to "
        "315360000 seconds.",
        "outbox_sweep_batch_size=0 is not accepted: give an integer from 1 to 10000 rows.",
        "outbox_retry_queue='' is not accepted: give None, or a queue name such as 'retries'.",
    ):
        assert expected in report
    assert report.count("django_outbox.E001") == 5


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("nowhere_at_all.Store", "cannot be imported"),
        ("collections.OrderedDict", "not an OutboxStore"),
        ("celery_outbox.sqlalchemy.SQLAlchemyOutboxStore", "could not be built"),
    ],
)
def test_an_outbox_store_that_does_not_import_is_an_error(
    celery_app: Celery, path: str, says: str
) -> None:
    celery_app.conf.outbox_store = path
    (message,) = outbox_errors()["django_outbox.E004"]
    assert f"outbox_store={path!r}" in message
    assert says in message


def test_the_real_stores_pass_the_store_check(celery_app: Celery) -> None:
    celery_app.conf.outbox_store = "django_outbox.store.DjangoOutboxStore"
    assert checks.check_store() == []


@pytest.mark.parametrize(
    ("path", "says"),
    [
        ("nowhere_at_all.celery:app", "cannot be imported"),
        ("celery_outbox.config:DEFAULTS", "not a Celery app"),
    ],
)
def test_a_celery_app_setting_that_does_not_import_is_an_error(
    settings: Any, path: str, says: str
) -> None:
    # Before: the admin's requeue action answered HTTP 500 and nothing warned.
    settings.DJANGO_OUTBOX_CELERY_APP = path
    (message,) = outbox_errors()["django_outbox.E005"]
    assert f"DJANGO_OUTBOX_CELERY_APP={path!r}" in message
    assert says in message


def test_a_task_serializer_the_workers_refuse_is_an_error(celery_app: Celery) -> None:
    # Before: only the pickle warning W001, although every dispatch then fails.
    celery_app.conf.task_serializer = "pickle"
    (message,) = outbox_errors()["django_outbox.E006"]
    assert "task_serializer='pickle'" in message
    assert "accept_content=['json']" in message
    celery_app.conf.accept_content = ["json", "pickle"]
    assert checks.check_task_serializer() == []


def test_a_valid_configuration_raises_nothing(celery_app: Celery) -> None:
    call_command("check")
