"""A dead letter larger than the database takes (issue 43), with a real worker on Redis.

MariaDB's ``max_allowed_packet`` is 16 MiB; a task raising ``ValueError("x" * 9_000_000)``
made a letter of about 18 MB (message and traceback): the write failed (1153, then 2006),
was taken for an outage, and the task ran again without end, logging 9 MB each time.
Now the letter is bounded before it is written: stored once, the body run once, on MariaDB
and PostgreSQL. Arguments larger than ``outbox_max_payload_bytes`` are left out of the
letter (MariaDB reports a 20 MB statement as "server has gone away"); a packet MariaDB
refuses with 1153 is data, and the Django store reconnects to write the minimal letter.
A store that stays down puts the message back ``outbox_store_requeues`` times, then holds
it on its holding queue; a worker on that queue, the store back, writes its dead letter
without running the task again. The worker's log lines stay bounded throughout.
"""

from __future__ import annotations

import json
import re
import shutil
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis

from celery_outbox.dead_letters import ARGUMENTS_KEY, INCOMPLETE_KEY, LETTER_TEXT_CHARS
from celery_outbox.long_text import LOG_LINE_CHARS
from celery_outbox.store.records import DEAD_LETTER_TABLE
from tests.brokers import delete_queue
from tests.conftest import StartWorker
from tests.django.conftest import close_app
from tests.django.retry_tasks import attempts, create_retry_app
from tests.django.test_other_databases import run_django
from tests.django.test_unstorable_dead_letters_e2e import letters as other_letters
from tests.reliability.mariadb_server import ThrowawayMariaDB
from tests.reliability.servers import ServerUnavailable
from tests.services import free_port, parse_db_url, services_required
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
    start_worker: StartWorker,
    url: str,
    redis_url: str,
    queue: str,
    output: Path,
    *,
    consume: str | None = None,
    **conf: Any,
) -> WorkerProcess:
    """A worker of the retry app on ``url``, consuming ``queue`` (or ``consume``)."""
    env = {
        "OUTBOX_TEST_BROKER": redis_url,
        "OUTBOX_TEST_QUEUE": queue,
        "OUTBOX_TEST_OUTPUT": str(output),
        "OUTBOX_DJANGO_DB_URL": url,
        "OUTBOX_TEST_CONF": json.dumps(conf),
    }
    return start_worker("tests.django.retry_worker", queue=consume or queue, env=env)


def send(redis_url: str, queue: str, name: str, *args: Any) -> str:
    """Send task ``name`` with ``args`` to ``queue`` straight (not through an outbox)."""
    app = create_retry_app(redis_url, queue)
    try:
        return str(app.send_task(name, args=args).id)
    finally:
        close_app(app)


def bounded_log(worker: WorkerProcess, *, total: int) -> str:
    """The worker's log, after checking that each of our lines is bounded, and the whole."""
    log = worker.log_text()
    ours = [line for line in log.splitlines() if "celery-outbox" in line]
    assert ours, log[-2000:]
    assert max(len(line) for line in ours) < LOG_LINE_CHARS + 200
    assert len(log) < total
    return log


def test_an_oversized_dead_letter_is_stored_once_bounded_and_the_task_runs_once(
    database_url: str,
    redis_url: str,
    queue_name: str,
    tmp_path: Path,
    celery_worker_process: StartWorker,
) -> None:
    output = tmp_path / "attempts.jsonl"
    worker = start(celery_worker_process, database_url, redis_url, queue_name, output)
    task_id = send(redis_url, queue_name, "retry.huge", "huge", SIZE)

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
    # Celery's own failure line prints the exception (and its traceback) once.
    bounded_log(worker, total=3 * SIZE)


def test_arguments_larger_than_the_payload_limit_make_a_letter_without_them(
    mysql_database_url: str,
    redis_url: str,
    queue_name: str,
    tmp_path: Path,
    celery_worker_process: StartWorker,
) -> None:
    # 20 MB of arguments in one statement: MariaDB drops the connection while it is still
    # sent, and the driver says "server has gone away" (2006): an outage, by its code.
    # Before: put back with its letter, which failed the same way, without end.
    url = mysql_database_url
    run_django(["django", "migrate", "--noinput", "-v", "0"], {"OUTBOX_DJANGO_DB_URL": url})
    output = tmp_path / "attempts.jsonl"
    worker = start(celery_worker_process, url, redis_url, queue_name, output)
    task_id = send(redis_url, queue_name, "retry.poison_once", "big", "y" * 20_000_000)

    wait_for(lambda: len(letters(url)) >= 1, timeout=60, what="the dead letter")
    time.sleep(2.0)
    (letter,) = letters(url)
    assert (letter["task_id"], letter["args"], letter["kwargs"]) == (task_id, [], {})
    assert letter["exception_message"].startswith("poison big")
    original = letter["options"]["original"]
    assert "above outbox_max_payload_bytes=4,194,304" in original[INCOMPLETE_KEY]
    assert original[ARGUMENTS_KEY].startswith('[["big", "yyy')
    assert [entry["key"] for entry in attempts(output)] == ["big"]
    assert "put back" not in bounded_log(worker, total=200_000)


@pytest.fixture(scope="module")
def small_packet_mariadb() -> Iterator[ThrowawayMariaDB]:
    """A MariaDB of this module's own refusing statements over 64 KiB (1153)."""
    workdir = Path(tempfile.mkdtemp(prefix="outbox-letters-mariadb-"))
    try:
        server = ThrowawayMariaDB(workdir, options=("--max-allowed-packet=65536",))
        server.start()
    except ServerUnavailable as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        if services_required():
            pytest.fail(f"throwaway MariaDB unavailable: {exc}", pytrace=False)
        pytest.skip(f"throwaway MariaDB unavailable: {exc}")
    try:
        yield server
    finally:
        server.close()
        shutil.rmtree(workdir, ignore_errors=True)


def test_a_letter_mariadb_refuses_as_too_big_is_stored_minimal_on_a_new_connection(
    small_packet_mariadb: ThrowawayMariaDB,
    redis_url: str,
    queue_name: str,
    tmp_path: Path,
    celery_worker_process: StartWorker,
) -> None:
    # Arguments under outbox_max_payload_bytes, over the server's max_allowed_packet (a
    # limit set above what the server takes): MariaDB answers 1153 and drops the
    # connection. A value refused, not an outage: the Django store closes the broken
    # connection and writes the minimal letter on a new one.
    import pymysql

    name = f"letters_{queue_name[-8:]}"
    admin = pymysql.connect(host="127.0.0.1", port=small_packet_mariadb.port, user="root")
    with admin.cursor() as cur:
        cur.execute(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4")
    admin.close()
    url = small_packet_mariadb.url(name)
    run_django(["django", "migrate", "--noinput", "-v", "0"], {"OUTBOX_DJANGO_DB_URL": url})
    output = tmp_path / "attempts.jsonl"
    worker = start(
        celery_worker_process, url, redis_url, queue_name, output, outbox_max_payload_bytes=10**6
    )
    task_id = send(redis_url, queue_name, "retry.poison_once", "packet", "y" * 200_000)

    wait_for(lambda: len(letters(url)) >= 1, timeout=60, what="the dead letter")
    time.sleep(2.0)
    (letter,) = letters(url)
    assert (letter["task_id"], letter["args"]) == (task_id, [])
    assert "max_allowed_packet" in letter["exception_message"]  # why it is not whole
    assert letter["options"]["original"][INCOMPLETE_KEY]
    assert [entry["key"] for entry in attempts(output)] == ["packet"]
    log = bounded_log(worker, total=100_000)
    assert "(1153, " in log
    assert "put back" not in log


def test_a_store_that_stays_down_holds_the_message_after_its_put_backs(
    postgres_database_url: str,
    redis_url: str,
    queue_name: str,
    tmp_path: Path,
    celery_worker_process: StartWorker,
) -> None:
    output = tmp_path / "attempts.jsonl"
    down = f"postgresql://postgres@127.0.0.1:{free_port()}/nowhere"
    worker = start(
        celery_worker_process, down, redis_url, queue_name, output, outbox_store_requeues=2
    )
    size = 2_000_000  # the message of the failure: logged bounded, carried bounded
    task_id = send(redis_url, queue_name, "retry.huge", "down", size)
    held = f"{queue_name}.outbox_held"
    broker = redis.Redis.from_url(redis_url)
    try:
        wait_for(lambda: "held on queue" in worker.log_text(), timeout=30, what="the hold")
        time.sleep(3.0)  # no put-back follows the hold
        log = bounded_log(worker, total=100_000)
        put_backs = re.findall(rf"\[{task_id}\] put back until \S+ \(put-back (\d) of 2;", log)
        assert put_backs == ["1", "2"]
        assert len(re.findall(rf"\[{task_id}\] was put back 2 times", log)) == 1
        assert f"held on queue '{held}' with its dead letter" in log
        assert [entry["key"] for entry in attempts(output)] == ["down"]  # the body ran once
        assert broker.llen(held) == 1

        # The store is back: a worker on the holding queue writes the letter it carries.
        url = postgres_database_url
        run_django(["django", "migrate", "--noinput", "-v", "0"], {"OUTBOX_DJANGO_DB_URL": url})
        start(celery_worker_process, url, redis_url, queue_name, output, consume=held)
        wait_for(lambda: len(letters(url)) >= 1, timeout=60, what="the dead letter")
        time.sleep(1.0)
        (letter,) = letters(url)
        assert (letter["task_id"], letter["args"]) == (task_id, ["down", size])
        assert f"of {size:,} characters" in letter["exception_message"]
        assert [entry["key"] for entry in attempts(output)] == ["down"]  # not run again
        assert broker.llen(held) == 0
    finally:
        broker.close()
        delete_queue(redis_url, held)
