"""Admin changelists load only the columns they show (issue 13 #6), on real PostgreSQL
through Django's test client with a logged-in superuser; detail pages stay complete.
"""

from __future__ import annotations

import tracemalloc
from typing import Any

import pytest
from django.contrib.auth.models import User
from django.db import connection
from django.test import Client
from django.test.utils import CaptureQueriesContext
from django.urls import reverse
from django.utils import timezone

from celery_outbox.store.records import MessageStatus
from django_outbox.admin.base import HEAD_CHARS
from django_outbox.models import DeadLetter, OutboxMessage
from tests.django.admin_app import APP_PATH, make_letter

pytestmark = pytest.mark.django_db

LETTERS = reverse("admin:django_outbox_deadletter_changelist")
MESSAGES = reverse("admin:django_outbox_outboxmessage_changelist")
MB = 1024 * 1024
ROWS = 12


@pytest.fixture(autouse=True)
def _outbox_app(settings: Any) -> None:
    """The admin's actions run through the test app (``tests.django.admin_app``), not
    whichever app another test module happened to create first.
    """
    settings.DJANGO_OUTBOX_CELERY_APP = APP_PATH


@pytest.fixture
def client(admin_user: User) -> Client:
    client = Client()
    client.force_login(admin_user)
    return client


def big_letters() -> list[DeadLetter]:
    """Dead letters with 1 MB arguments, tracebacks and messages (after a short first line)."""
    return [
        make_letter(
            args=["a" * MB],
            kwargs={"blob": "k" * MB},
            traceback="t" * MB,
            exception_message=f"first line {n}\n" + "m" * MB,
        )
        for n in range(ROWS)
    ]


def big_rows() -> list[OutboxMessage]:
    """Failed outbox rows with 1 MB payloads and errors."""
    rows = [
        OutboxMessage(
            task_id=f"big-{n}",
            task_name="tests.noop",
            payload="p" * MB,
            options={"headers": {"blob": "o" * MB}},
            status=MessageStatus.FAILED.value,
            available_at=timezone.now(),
            last_error=f"broker said no {n}\n" + "e" * MB,
        )
        for n in range(ROWS)
    ]
    return OutboxMessage.objects.bulk_create(rows)


def list_page(client: Client, url: str, table: str) -> tuple[Any, list[str], int]:
    """GET a changelist: the response, the SELECTs of ``table`` and the peak of Python memory."""
    tracemalloc.start()
    try:
        with CaptureQueriesContext(connection) as queries:
            response = client.get(url)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert response.status_code == 200
    selects = [
        q["sql"]
        for q in queries.captured_queries
        if q["sql"].startswith("SELECT") and f'FROM "{table}"' in q["sql"]
    ]
    return response, selects, peak


def columns_of(sql: str) -> str:
    """The select list of ``sql``."""
    return sql.split(" FROM ", 1)[0]


def assert_light(
    selects: list[str], table: str, large: tuple[str, ...], shown: tuple[str, ...]
) -> None:
    page_queries = [sql for sql in selects if sql.startswith(f'SELECT "{table}"."id"')]
    assert page_queries, selects
    for sql in page_queries:
        select_list = columns_of(sql)
        for column in large:
            assert f'"{table}"."{column}"' not in select_list, (column, sql)
        for column in shown:
            assert f'"{table}"."{column}"' in select_list


def test_the_dead_letter_list_loads_no_large_column(client: Client) -> None:
    letters = big_letters()
    response, selects, peak = list_page(client, LETTERS, "celery_outbox_deadletter")
    print(f"dead-letter changelist, {ROWS} letters of ~4 MB: peak {peak / MB:.1f} MB")
    assert_light(
        selects,
        "celery_outbox_deadletter",
        large=("args", "kwargs", "options", "traceback"),
        shown=("task_name", "exception_type", "failed_at", "task_id"),
    )
    # The message column is a bounded prefix of exception_message, never all of it.
    assert any('LEFT("celery_outbox_deadletter"."exception_message", 320)' in s for s in selects)
    assert peak < 4 * MB
    content = response.content.decode()
    assert all(f"first line {n}" in content for n in range(ROWS))
    # Its loaded head is the hover text (title); never more than that.
    assert "m" * (HEAD_CHARS - len("first line 11\n")) in content
    assert "m" * HEAD_CHARS not in content
    # The detail page still shows everything.
    detail = client.get(reverse("admin:django_outbox_deadletter_change", args=[letters[0].pk]))
    assert detail.status_code == 200
    assert "a" * 1000 in detail.content.decode()
    assert "t" * 1000 in detail.content.decode()


def test_the_outbox_message_list_loads_no_large_column(client: Client) -> None:
    rows = big_rows()
    response, selects, peak = list_page(client, MESSAGES, "celery_outbox_message")
    print(f"outbox-message changelist, {ROWS} rows of ~3 MB: peak {peak / MB:.1f} MB")
    assert_light(
        selects,
        "celery_outbox_message",
        large=("payload", "options"),
        shown=("task_name", "task_id", "status", "attempts"),
    )
    assert peak < 4 * MB
    content = response.content.decode()
    assert all(f"broker said no {n}" in content for n in range(ROWS))
    detail = client.get(reverse("admin:django_outbox_outboxmessage_change", args=[rows[0].pk]))
    assert "p" * 1000 in detail.content.decode()


def test_an_action_on_the_slim_list_still_works(client: Client) -> None:
    letter = make_letter(args=["a" * MB])
    data: dict[str, Any] = {
        "action": "discard_selected",
        "_selected_action": [str(letter.pk)],
        "index": "0",
    }
    response = client.post(LETTERS, data, follow=True)
    assert response.status_code == 200
    letter.refresh_from_db()
    assert letter.status == "discarded"


def test_a_list_counts_to_its_bound_and_says_when_it_estimates(
    client: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    from django_outbox.admin import paging as admin_paging

    for n in range(5):
        make_letter(task_name=f"tasks.t{n % 2}")
    assert "5 dead letters" in client.get(LETTERS).content.decode()

    monkeypatch.setattr(admin_paging, "EXACT_UP_TO", 3)
    with CaptureQueriesContext(connection) as queries:
        page = client.get(LETTERS).content.decode()
    counts = [q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper()]
    assert counts
    assert all("LIMIT 4" in sql for sql in counts), counts  # never the whole table
    estimated = "about " if connection.vendor == "postgresql" else "more than 3"
    assert estimated in page
    assert "5 dead letters" not in page


def test_a_value_filter_offers_the_values_of_recent_rows_and_filters(client: Client) -> None:
    make_letter(task_name="tasks.old")
    make_letter(task_name="tasks.new")
    page = client.get(LETTERS).content.decode()
    assert "?task_name=tasks.old" in page
    assert "?task_name=tasks.new" in page
    filtered = client.get(LETTERS, {"task_name": "tasks.old"}).content.decode()
    assert "1 dead letter" in filtered
