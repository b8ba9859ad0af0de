"""``manage.py outbox requeue`` on real PostgreSQL: filters, --dry-run, --by and errors."""

from __future__ import annotations

import io
from datetime import timedelta
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from celery_outbox.store.records import DeadLetterStatus
from django_outbox.models import DeadLetter, OutboxMessage
from tests.django.admin_app import APP_PATH, BASE_TIME, OTHER, make_letter

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def _outbox_app(settings: Any) -> None:
    """Requeue through the test app (``tests.django.admin_app``)."""
    settings.DJANGO_OUTBOX_CELERY_APP = APP_PATH


def requeue(*args: str) -> str:
    """Run ``outbox requeue`` with ``args``; its standard output."""
    out = io.StringIO()
    call_command("outbox", "requeue", *args, stdout=out)
    return out.getvalue()


def requeued_ids() -> set[int]:
    """Ids of the letters that are now ``requeued``."""
    return set(
        DeadLetter.objects.filter(status=DeadLetterStatus.REQUEUED.value).values_list(
            "id", flat=True
        )
    )


@pytest.fixture
def letters() -> dict[str, Any]:
    """Four dead letters of different tasks, exceptions and failure times, one discarded."""
    hour = timedelta(hours=1)
    return {
        "a": make_letter(task_name=OTHER, retries=2),
        "key": make_letter(exception_type="builtins.KeyError", failed_at=BASE_TIME + hour),
        "late": make_letter(failed_at=BASE_TIME + 2 * hour),
        "gone": make_letter(status=DeadLetterStatus.DISCARDED.value),
    }


def test_by_task_name(letters: dict[str, Any]) -> None:
    out = requeue("--task", "django_e2e.record")
    assert requeued_ids() == {letters["key"].pk, letters["late"].pk}
    assert "default: requeued 2 dead letter(s), 0 failed" in out
    assert OutboxMessage.objects.count() == 2


@pytest.mark.parametrize("name", ["KeyError", "builtins.KeyError"])
def test_by_exception_type_path_or_class_name(letters: dict[str, Any], name: str) -> None:
    requeue("--exception", name)
    assert requeued_ids() == {letters["key"].pk}


def test_by_time_range(letters: dict[str, Any]) -> None:
    requeue("--since", "2024-05-01T12:30:00+00:00", "--until", "2024-05-01T14:00:00Z")
    assert requeued_ids() == {letters["key"].pk}


def test_since_in_another_offset(letters: dict[str, Any]) -> None:
    requeue("--since", "2024-05-01T15:30:00+02:00")  # 13:30 UTC
    assert requeued_ids() == {letters["late"].pk}


def test_by_ids_skips_letters_that_are_not_dead(letters: dict[str, Any]) -> None:
    requeue("--id", str(letters["a"].pk), "--id", str(letters["gone"].pk))
    assert requeued_ids() == {letters["a"].pk}


def test_all_requeues_every_dead_letter(letters: dict[str, Any]) -> None:
    requeue("--all")
    assert requeued_ids() == {letters[k].pk for k in ("a", "key", "late")}


def test_by_is_recorded(letters: dict[str, Any]) -> None:
    requeue("--id", str(letters["a"].pk), "--by", "ops:jane")
    letters["a"].refresh_from_db()
    assert letters["a"].requeued_by == "ops:jane"


def test_default_by_is_manage_py(letters: dict[str, Any]) -> None:
    out = requeue("--id", str(letters["a"].pk))
    letters["a"].refresh_from_db()
    assert letters["a"].requeued_by == "manage.py"
    assert f"requeued #{letters['a'].pk} as task {letters['a'].requeued_task_id}" in out


def test_dry_run_lists_and_changes_nothing(letters: dict[str, Any]) -> None:
    out = requeue("--task", "django_e2e.record", "--dry-run")
    assert f"would requeue #{letters['key'].pk} django_e2e.record[" in out
    assert "builtins.KeyError failed 2024-05-01T13:00:00+00:00" in out
    assert "default: would requeue 2 dead letter(s) (dry run)" in out
    assert requeued_ids() == set()
    assert not OutboxMessage.objects.exists()


def test_running_twice_requeues_once(letters: dict[str, Any]) -> None:
    requeue("--id", str(letters["a"].pk))
    out = requeue("--id", str(letters["a"].pk))
    assert "requeued 0 dead letter(s)" in out
    assert OutboxMessage.objects.count() == 1


def test_no_filter_is_refused(letters: dict[str, Any]) -> None:
    with pytest.raises(CommandError, match="or --all"):
        requeue()
    assert requeued_ids() == set()


@pytest.mark.parametrize("value", ["2024-05-01T12:00:00", "2024-05-01"])
def test_naive_time_is_an_error_naming_it(value: str) -> None:
    with pytest.raises(CommandError, match=f"'{value}' has no timezone"):
        requeue("--since", value)


def test_unparseable_time_is_an_error() -> None:
    with pytest.raises(CommandError, match="'yesterday' is not an ISO 8601 time"):
        requeue("--until", "yesterday")


def test_unregistered_task_fails_after_requeuing_the_others(letters: dict[str, Any]) -> None:
    bad = make_letter(task_name="shop.renamed_task")
    expected = rf"1 dead letter\(s\) could not be requeued:\n#{bad.pk}: .*'shop.renamed_task'"
    with pytest.raises(CommandError, match=expected):
        requeue("--all")
    assert requeued_ids() == {letters[k].pk for k in ("a", "key", "late")}
    bad.refresh_from_db()
    assert bad.status == DeadLetterStatus.DEAD.value


def test_arguments_the_task_no_longer_accepts_fail_after_requeuing_the_others(
    letters: dict[str, Any],
) -> None:
    stale = make_letter(args=[1, 2, 3, 4])
    expected = (
        rf"1 dead letter\(s\) could not be requeued:\n#{stale.pk}: Cannot requeue dead letter "
        rf"{stale.pk} of task 'django_e2e.record': its arguments do not fit"
    )
    with pytest.raises(CommandError, match=expected):
        requeue("--all")
    assert requeued_ids() == {letters[k].pk for k in ("a", "key", "late")}
    stale.refresh_from_db()
    assert stale.status == DeadLetterStatus.DEAD.value
