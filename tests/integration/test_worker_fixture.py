"""The worker fixture against real brokers: a worker starts, runs tasks, and dies by PID."""

from __future__ import annotations

import time
from pathlib import Path

from tests.conftest import StartWorker
from tests.integration.plain_app import APPEND_LINE, create_app
from tests.worker import wait_for

TASKS = 5


def _line_count(path: Path) -> int:
    return len(path.read_text().splitlines()) if path.exists() else 0


def _send_tasks(broker_url: str, queue: str) -> None:
    app = create_app(broker_url, queue)
    try:
        for number in range(TASKS):
            app.tasks[APPEND_LINE].apply_async(args=(f"task {number}",), queue=queue)
    finally:
        app.close()


def test_worker_runs_tasks_and_is_killed_by_pid(
    celery_worker_process: StartWorker, broker_url: str, broker_queue: str, tmp_path: Path
) -> None:
    output = tmp_path / "lines.txt"
    env = {"OUTBOX_TEST_BROKER": broker_url, "OUTBOX_TEST_QUEUE": broker_queue}
    env["OUTBOX_TEST_OUTPUT"] = str(output)
    worker = celery_worker_process(
        "tests.integration.plain_app", queue=broker_queue, env=env, pool="prefork", concurrency=2
    )
    assert worker.group_pids(), "the prefork worker has processes"

    _send_tasks(broker_url, broker_queue)
    wait_for(lambda: _line_count(output) == TASKS, timeout=30, what=f"{TASKS} lines")

    worker.kill()
    assert not worker.is_running()
    assert worker.group_pids() == [], "the kill reached the pool children too"
    assert not Path(f"/proc/{worker.pid}").exists()
    assert sorted(output.read_text().splitlines()) == [f"task {n}" for n in range(TASKS)]


def test_worker_stop_is_a_warm_shutdown(
    celery_worker_process: StartWorker, memory_broker_url: str, queue_name: str, tmp_path: Path
) -> None:
    env = {"OUTBOX_TEST_BROKER": memory_broker_url, "OUTBOX_TEST_QUEUE": queue_name}
    worker = celery_worker_process("tests.integration.plain_app", queue=queue_name, env=env)

    status = worker.stop(timeout=20)

    assert status == 0, worker.log_text()
    assert worker.group_pids() == []


def test_an_idle_worker_stops_warm_at_once(
    celery_worker_process: StartWorker, broker_url: str, broker_queue: str, tmp_path: Path
) -> None:
    # tests.worker_main wakes the event loop on SIGTERM: an idle RabbitMQ worker's hub
    # would otherwise sleep up to 10 s before it saw the signal.
    env = {"OUTBOX_TEST_BROKER": broker_url, "OUTBOX_TEST_QUEUE": broker_queue}
    env["OUTBOX_TEST_OUTPUT"] = str(tmp_path / "lines.txt")
    worker = celery_worker_process("tests.integration.plain_app", queue=broker_queue, env=env)
    time.sleep(1.0)  # idle: nothing is due in its event loop

    started = time.monotonic()
    status = worker.stop(timeout=20)

    assert status == 0, worker.log_text()
    assert time.monotonic() - started < 5.0
