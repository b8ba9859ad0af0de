"""``manage.py outbox`` arguments out of range are errors naming the value and the range:
never a traceback, never a silent clamp (issue 13 #8 and its low items), on real PostgreSQL.
"""

from __future__ import annotations

import io
from datetime import datetime, timedelta, timezone
from typing import Any

import pytest
from django.core.management import call_command
from django.core.management.base import CommandError

from celery_outbox.store.records import DeadLetterStatus, MessageStatus
from django_outbox.management.commands.outbox import Command
from django_outbox.models import CompletedTask, DeadLetter, OutboxMessage
from tests.django.admin_app import APP_PATH, make_letter

pytestmark = pytest.mark.django_db

WEEK = timedelta(days=7)


@pytest.fixture(autouse=True)
def _outbox_app(settings: Any) -> None:
    settings.DJANGO_OUTBOX_CELERY_APP = APP_PATH


def outbox(*args: str) -> str:
    """Run ``manage.py outbox *args``; its standard output."""
    out = io.StringIO()
    call_command("outbox", *args, stdout=out)
    return out.getvalue()


def add_row(task_id: str, status: MessageStatus, *, age: timedelta) -> None:
    """A row of ``status`` created ``age`` ago."""
    now = datetime.now(timezone.utc)
    OutboxMessage.objects.create(
        task_id=task_id,
        task_name="tests.noop",
        payload="[[], {}, {}]",
        options={},
        status=status.value,
        available_at=now,
        created_at=now - age,
    )


@pytest.fixture
def rows() -> list[str]:
    """Two fresh rows (published, failed), one old published row and one pending row."""
    add_row("new-published", MessageStatus.PUBLISHED, age=timedelta(minutes=1))
    add_row("new-failed", MessageStatus.FAILED, age=timedelta(minutes=1))
    add_row("old-published", MessageStatus.PUBLISHED, age=2 * WEEK)
    add_row("pending", MessageStatus.PENDING, age=2 * WEEK)
    return sorted(OutboxMessage.objects.values_list("task_id", flat=True))


def task_ids() -> list[str]:
    return sorted(OutboxMessage.objects.values_list("task_id", flat=True))


@pytest.mark.parametrize("age", ["-604800", "nan", "inf", "-inf", "1e300", "week"])
def test_purge_refuses_an_age_it_cannot_mean_and_deletes_nothing(rows: list[str], age: str) -> None:
    # Before: max(-604800, 0) == 0, so every published and failed row was deleted.
    with pytest.raises(CommandError) as caught:
        outbox("purge", f"--older-than={age}")
    assert f"argument --older-than: {age!r} is not accepted: give 0 to 3153600000 seconds." in (
        str(caught.value)
    )
    assert task_ids() == rows


def test_purge_dry_run_counts_and_deletes_nothing(rows: list[str]) -> None:
    report = outbox("purge", "--older-than", str(WEEK.total_seconds()), "--dry-run")
    lines = report.splitlines()
    assert lines[0].startswith("default: would purge 1 published row(s) created before ")
    assert lines[1].startswith("default: would purge 0 failed row(s) created before ")
    assert task_ids() == rows
    assert outbox("purge", "--older-than", str(WEEK.total_seconds())) == (
        "default: purged 1 row(s)\n"
    )
    assert "old-published" not in task_ids()


def test_purge_completed_dry_run_counts_and_deletes_nothing(rows: list[str]) -> None:
    now = datetime.now(timezone.utc)
    for task_id, age in (("old", 2 * WEEK), ("new", timedelta(minutes=1))):
        CompletedTask.objects.create(task_id=task_id, task_name="t", completed_at=now - age)
    report = outbox("purge", "--completed", "--older-than", str(WEEK.total_seconds()), "--dry-run")
    assert report.startswith("default: would purge 1 completed task(s) completed before ")
    assert report.endswith(" (dry run)\n")
    assert CompletedTask.objects.count() == 2
    assert task_ids() == rows


def test_purge_completed_with_a_status_is_refused(rows: list[str]) -> None:
    with pytest.raises(CommandError, match=r"--completed: not allowed with argument --status"):
        outbox("purge", "--older-than", "0", "--status", "published", "--completed")
    assert task_ids() == rows


@pytest.mark.parametrize("batch", ["0", "-5", "1e3", "100001"])
def test_purge_batch_out_of_range_is_refused_not_clamped(rows: list[str], batch: str) -> None:
    with pytest.raises(CommandError, match=r"an integer from 1 to 100000 rows"):
        outbox("purge", "--older-than", "0", f"--batch={batch}")
    assert task_ids() == rows


@pytest.mark.parametrize("poll", ["nan", "inf", "-1", "0", "1e-9"])
def test_relay_poll_out_of_range_is_refused_before_the_loop_starts(poll: str) -> None:
    # Before: accepted; with NaN and the database down the loop wrote 109,810 lines in 6 s.
    parser = Command().create_parser("manage.py", "outbox")
    with pytest.raises(CommandError, match=r"give 0\.01 to 3600 seconds"):
        parser.parse_args(["relay", f"--poll={poll}"])
    with pytest.raises(CommandError, match=r"--grace: '-1' is not accepted"):
        parser.parse_args(["relay", "--grace=-1"])
    assert parser.parse_args(["relay", "--poll", "0.5"]).poll == 0.5


@pytest.mark.parametrize(
    ("args", "says"),
    [
        (
            ("--since", "9999-12-31T23:59:59-23:59"),
            "'9999-12-31T23:59:59-23:59' is out of range: give a time from 0001-01-01",
        ),
        (("--until", "0001-01-01T00:00:00+01:00"), "is out of range"),
        (("--id", str(10**23)), f"'{10**23}' is not accepted: give an integer from 1 to "),
        (("--id", "0"), "'0' is not accepted"),
        (("--all", "--database", "nope"), "--database 'nope' is not accepted"),
        (("--all", "--by", "x" * 151), "give at most 150 characters (it has 151)"),
    ],
)
def test_requeue_arguments_out_of_range_name_the_value(args: tuple[str, ...], says: str) -> None:
    letter = make_letter()
    with pytest.raises(CommandError) as caught:
        outbox("requeue", *args)
    assert says in str(caught.value)
    letter.refresh_from_db()
    assert letter.status == DeadLetterStatus.DEAD.value
    assert DeadLetter.objects.filter(status=DeadLetterStatus.REQUEUED.value).count() == 0


def test_status_with_an_unknown_database_names_it() -> None:
    with pytest.raises(CommandError, match=r"--database 'nope' is not accepted: give one of"):
        outbox("status", "--database", "nope")
