"""A dead letter larger than the database takes (issue 43), with a real worker on Redis.

MariaDB's ``max_allowed_packet`` is 16 MiB; a task raising ``ValueError("x" * 9_000_000)``
made a letter of about 18 MB (message and traceback): the write failed (1153, then 2006),
was taken for an outage, and the task ran again without end, logging 9 MB each time.
Now the letter is bounded before it is written: stored once, the body run once, on MariaDB
and PostgreSQL; and a store that stays down runs the body once and only puts the message
back with its letter, never running it again.
"""

from __future__ import annotations

import json
import re
import socket
import time
from pathlib import Path
from typing import Any

import pytest

from celery_outbox.dead_letters import LETTER_TEXT_CHARS
from celery_outbox.records import DEAD_LETTER_TABLE
from tests.conftest import StartWorker
from tests.django.conftest import close_app
from tests.django.retry_tasks import attempts, create_retry_app
from tests.django.test_other_databases import run_django
from tests.django.test_unstorable_dead_letters_e2e import letters as other_letters
from tests.services import parse_db_url
from tests.worker import WorkerProcess, wait_for

SIZE = 9_000_000


@pytest.fixture(params=["mysql", "postgres"])
def database_url(request: pytest.FixtureRequest) -> str:
    """A fresh, migrated MariaDB or PostgreSQL database."""
    url = str(request.getfixturevalue(f"{request.param}_database_url"))
    run_django(["django", "migrate", "--noinput", "-v", "0"], {"OUTBOX_DJANGO_DB_URL": url})
    return url


def letters(url: str) -> list[dict[str, Any]]:
    """Every dead letter of the database at ``url`` (MariaDB here; the others elsewhere)."""
    if not url.startswith("mysql"):
        return other_letters(url)
    import pymysql

    params = parse_db_url(url)
    conn = pymysql.connect(
        host=params.host,
        port=params.port or 3306,
        user=params.user,
        password=params.password,
        database=params.name,
        cursorclass=pymysql.cursors.DictCursor,
    )
    try:
        with conn.cursor() as cur:
            cur.execute(f"SELECT * FROM {DEAD_LETTER_TABLE} ORDER BY id")
            rows = list(cur.fetchall())
    finally:
        conn.close()
    for row in rows:
        for column in ("args", "kwargs", "options"):
            row[column] = json.loads(row[column])
    return rows


def start(
    start_worker: StartWorker, url: str, redis_url: str, queue: str, output: Path
) -> WorkerProcess:
    env = {
        "OUTBOX_TEST_BROKER": redis_url,
        "OUTBOX_TEST_QUEUE": queue,
        "OUTBOX_TEST_OUTPUT": str(output),
        "OUTBOX_DJANGO_DB_URL": url,
    }
    return start_worker("tests.django.retry_worker", queue=queue, env=env)


def send_huge(redis_url: str, queue: str) -> str:
    app = create_retry_app(redis_url, queue)
    try:
        return str(app.send_task("retry.huge", args=("huge", SIZE)).id)
    finally:
        close_app(app)


def test_an_oversized_dead_letter_is_stored_once_bounded_and_the_task_runs_once(
    database_url: str,
    redis_url: str,
    queue_name: str,
    tmp_path: Path,
    celery_worker_process: StartWorker,
) -> None:
    output = tmp_path / "attempts.jsonl"
    worker = start(celery_worker_process, database_url, redis_url, queue_name, output)
    task_id = send_huge(redis_url, queue_name)

    wait_for(lambda: len(letters(database_url)) >= 1, timeout=60, what="the dead letter")
    time.sleep(3.0)  # a put-back would run the task again within ~1 s
    (letter,) = letters(database_url)
    assert letter["task_id"] == task_id
    assert [entry["key"] for entry in attempts(output)] == ["huge"]
    message = letter["exception_message"]
    assert len(message) < LETTER_TEXT_CHARS + 200
    assert f"of {SIZE:,} characters" in message  # what was cut, and the original size
    assert len(letter["traceback"]) < LETTER_TEXT_CHARS + 200
    assert letter["args"] == ["huge", SIZE]
    log = worker.log_text()
    # Our lines are bounded; Celery's own failure line prints the exception once.
    ours = [line for line in log.splitlines() if "celery-outbox" in line]
    assert ours, log[-2000:]
    assert max(len(line) for line in ours) < 5_000
    assert len(log) < 3 * SIZE


def closed_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def test_a_store_that_stays_down_runs_the_task_once_and_keeps_its_letter_waiting(
    redis_url: str,
    queue_name: str,
    tmp_path: Path,
    celery_worker_process: StartWorker,
) -> None:
    output = tmp_path / "attempts.jsonl"
    down = f"postgresql://postgres@127.0.0.1:{closed_port()}/nowhere"
    worker = start(celery_worker_process, down, redis_url, queue_name, output)
    app = create_retry_app(redis_url, queue_name)
    try:
        task_id = str(app.send_task("retry.poison_once", args=("down",)).id)
    finally:
        close_app(app)

    def put_backs() -> list[str]:
        pattern = rf"\[{task_id}\] put back until \S+ \(put-back (\d+); its dead letter waits"
        return re.findall(pattern, worker.log_text())

    wait_for(lambda: len(put_backs()) >= 3, timeout=30, what="three put-backs")
    assert [entry["key"] for entry in attempts(output)] == ["down"]  # the body ran once
    assert put_backs()[:3] == ["1", "2", "3"]
    assert max(len(line) for line in worker.log_text().splitlines()) < 5_000
