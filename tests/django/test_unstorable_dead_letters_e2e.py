"""Dead letters the database would refuse (issue 13, item 3): NaN and Infinity in the
arguments, NUL and lone surrogates in the arguments and in the exception message.

A real worker on PostgreSQL (``jsonb``, text without NUL) and on SQLite (``JSON_VALID``
checks): each task ends as exactly one dead letter, escaped, with the originals kept as
text, and runs exactly once per allowed attempt — never again because its dead letter
did not fit (before the fix: put back and run again, without end).
"""

from __future__ import annotations

import json
import math
import sqlite3
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg.rows import dict_row

from celery_outbox.store.records import DEAD_LETTER_TABLE
from tests.conftest import StartWorker
from tests.django.conftest import close_app
from tests.django.retry_tasks import attempts, create_retry_app
from tests.django.test_other_databases import run_django
from tests.worker import wait_for

NAN_ARGS = (math.nan, math.inf, -math.inf)
BAD_TEXT = ("lone \ud800", "nul \x00 here")


@pytest.fixture(params=["postgresql", "sqlite"])
def database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh, migrated PostgreSQL database, or a fresh, migrated SQLite file."""
    if request.param == "postgresql":
        url = str(request.getfixturevalue("postgres_database_url"))
    else:
        url = f"sqlite:///{tmp_path / 'outbox.sqlite3'}"
    run_django(["django", "migrate", "--noinput", "-v", "0"], {"OUTBOX_DJANGO_DB_URL": url})
    return url


def letters(url: str) -> list[dict[str, Any]]:
    """Every dead letter row of the database at ``url``, JSON columns decoded."""
    query = f"SELECT * FROM {DEAD_LETTER_TABLE} ORDER BY id"
    if url.startswith("sqlite:///"):
        with sqlite3.connect(url.removeprefix("sqlite:///")) as conn:
            conn.row_factory = sqlite3.Row
            rows = [dict(row) for row in conn.execute(query)]
        for row in rows:
            for column in ("args", "kwargs", "options"):
                row[column] = json.loads(row[column])
        return rows
    with psycopg.connect(url) as conn, conn.cursor(row_factory=dict_row) as cur:
        return list(cur.execute(query))


@pytest.fixture
def started(
    database_url: str,
    redis_url: str,
    queue_name: str,
    tmp_path: Path,
    celery_worker_process: StartWorker,
) -> Callable[[], Path]:
    """Start a retry worker on the database; returns where it records attempts."""
    output = tmp_path / "attempts.jsonl"
    env = {
        "OUTBOX_TEST_BROKER": redis_url,
        "OUTBOX_TEST_QUEUE": queue_name,
        "OUTBOX_TEST_OUTPUT": str(output),
        "OUTBOX_DJANGO_DB_URL": database_url,
    }

    def start() -> Path:
        celery_worker_process("tests.django.retry_worker", queue=queue_name, env=env)
        return output

    return start


def test_unstorable_values_end_as_one_escaped_dead_letter_each(
    started: Callable[[], Path], database_url: str, redis_url: str, queue_name: str
) -> None:
    output = started()
    app = create_retry_app(redis_url, queue_name)
    try:
        # Straight to the broker (as any producer may): the worker gets these values as-is.
        nan_id = app.send_task("retry.poison", args=("nan", *NAN_ARGS)).id
        text_id = app.send_task("retry.poison_once", args=("text", *BAD_TEXT)).id
        kwargs_id = app.send_task("retry.poison_once", args=("kw",), kwargs={"x": math.nan}).id
    finally:
        close_app(app)

    wait_for(lambda: len(letters(database_url)) >= 3, timeout=30, what="three dead letters")
    time.sleep(3.0)  # a put-back would run again within ~1 s (STORE_BACKOFF's first window)
    by_id = {row["task_id"]: row for row in letters(database_url)}
    runs = [entry["key"] for entry in attempts(output)]
    assert len(by_id) == 3
    assert len(letters(database_url)) == 3
    assert (runs.count("nan"), runs.count("text"), runs.count("kw")) == (2, 1, 1)

    nan_letter = by_id[nan_id]
    assert nan_letter["args"] == ["nan", "NaN", "Infinity", "-Infinity"]
    assert nan_letter["retries"] == 1
    original = nan_letter["options"]["original"]
    restored = json.loads(original["args"])
    assert restored[0] == "nan"
    assert math.isnan(restored[1])
    assert restored[2:] == [math.inf, -math.inf]
    assert nan_letter["exception_message"] == "poison nan: nul=\\u0000 surrogate=\\ud800"
    assert json.loads(original["exception_message"]) == "poison nan: nul=\x00 surrogate=\ud800"
    assert "\x00" not in nan_letter["traceback"]

    text_letter = by_id[text_id]
    assert text_letter["args"] == ["text", "lone \\ud800", "nul \\u0000 here"]
    assert json.loads(text_letter["options"]["original"]["args"]) == ["text", *BAD_TEXT]
    assert by_id[kwargs_id]["kwargs"] == {"x": "NaN"}
