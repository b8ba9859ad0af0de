"""``celery beat`` runs the sweep task by itself: Celery's default scheduler and
django-celery-beat's ``DatabaseScheduler``, each with a real worker, broker and PostgreSQL.

Rows are committed without being published (a crash after COMMIT); nobody calls the
sweeper: beat sends ``celery_outbox.sweep``, the worker sweeps, the worker runs the tasks.
"""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from collections import Counter
from collections.abc import Callable, Iterator
from datetime import timedelta
from pathlib import Path

import psycopg
import pytest
from celery import Celery
from sqlalchemy import insert

from celery_outbox.clock import utcnow
from celery_outbox.dispatch.envelope import build_message
from celery_outbox.sqlalchemy import outbox_table
from celery_outbox.store.records import message_columns
from celery_outbox.sweep_task import BEAT_ENTRY, SWEEP_TASK
from tests.conftest import StartWorker
from tests.integration.sweep_app import create_tables, engine_for
from tests.integration.sweep_support import run_lines
from tests.worker import REPO_ROOT, wait_for, worker_env

APP = "tests.integration.sweep_beat_app"


@pytest.fixture
def start_beat(tmp_path: Path) -> Iterator[Callable[..., subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []

    def start(env: dict[str, str], *args: str) -> subprocess.Popen[bytes]:
        log = (tmp_path / "beat.log").open("wb")
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "celery",
                "-A",
                APP,
                "beat",
                "-l",
                "info",
                "-s",
                str(tmp_path / "celerybeat-schedule"),
                *args,
            ],
            cwd=REPO_ROOT,
            env=worker_env(env),
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        started.append(process)
        return process

    yield start
    for process in started:
        process.kill()
        process.wait(timeout=30)


def commit_rows(db_url: str, queue: str, task_name: str, count: int) -> list[str]:
    """Committed, never published rows of ``task_name`` (one ``None`` arg) for ``queue``."""
    app = Celery("rows", set_as_current=False)
    app.conf.task_default_queue = queue
    task = app.task(name=task_name, shared=False)(_noop)
    now = utcnow()
    values = [
        message_columns(
            build_message(
                task,
                (None,),
                {},
                task_id=f"beat-{n}",
                options={},
                now=now,
                park_after=timedelta(seconds=30),
                max_bytes=None,
            ),
            created_at=now,
        )
        for n in range(count)
    ]
    engine = engine_for(db_url)
    with engine.begin() as conn:
        conn.execute(insert(outbox_table), values)
    engine.dispose()
    return [v["task_id"] for v in values]


def _noop(*args: object) -> None:
    """Stands in for the task whose messages the rows hold."""


def run_ids(output: Path) -> Counter[str]:
    if output.suffix == ".jsonl":
        from tests.django.celery_app import runs

        return Counter(r["task_id"] for r in runs(output))
    return run_lines(output)


def test_the_default_scheduler_runs_the_sweep(
    broker_url: str,
    broker_queue: str,
    postgres_database_url: str,
    tmp_path: Path,
    celery_worker_process: StartWorker,
    start_beat: Callable[..., subprocess.Popen[bytes]],
) -> None:
    create_tables(postgres_database_url)
    output = tmp_path / "runs.txt"
    env = {
        "OUTBOX_TEST_BROKER": broker_url,
        "OUTBOX_TEST_QUEUE": broker_queue,
        "OUTBOX_TEST_DB": postgres_database_url,
        "OUTBOX_TEST_OUTPUT": str(output),
    }
    celery_worker_process(APP, queue=broker_queue, env=env)
    task_ids = commit_rows(postgres_database_url, broker_queue, "sweep_it.record", 10)
    start_beat(env)

    wait_for(lambda: sum(run_ids(output).values()) >= 10, timeout=60, what="swept runs")
    assert run_ids(output) == Counter(dict.fromkeys(task_ids, 1))
    assert f"Sending due task {BEAT_ENTRY} ({SWEEP_TASK})" in (tmp_path / "beat.log").read_text()


@pytest.mark.skipif(
    importlib.util.find_spec("django_celery_beat") is None,
    reason="django-celery-beat is not installed (dev extra)",
)
def test_django_celery_beat_database_scheduler_runs_the_sweep(
    broker_url: str,
    broker_queue: str,
    postgres_database_url: str,
    tmp_path: Path,
    celery_worker_process: StartWorker,
    start_beat: Callable[..., subprocess.Popen[bytes]],
) -> None:
    output = tmp_path / "runs.jsonl"
    env = {
        "OUTBOX_TEST_BROKER": broker_url,
        "OUTBOX_TEST_QUEUE": broker_queue,
        "OUTBOX_TEST_DJANGO": "1",
        "OUTBOX_DJANGO_DB_URL": postgres_database_url,
        "OUTBOX_TEST_OUTPUT": str(output),
    }
    subprocess.run(
        [sys.executable, "-m", "django", "migrate", "-v", "0"],
        check=True,
        cwd=REPO_ROOT,
        env=worker_env({**env, "DJANGO_SETTINGS_MODULE": "tests.integration.sweep_beat_settings"}),
    )
    celery_worker_process(APP, queue=broker_queue, env=env)
    task_ids = commit_rows(postgres_database_url, broker_queue, "django_e2e.record", 10)
    start_beat(env, "-S", "django_celery_beat.schedulers:DatabaseScheduler")

    wait_for(lambda: sum(run_ids(output).values()) >= 10, timeout=60, what="swept runs")
    assert run_ids(output) == Counter(dict.fromkeys(task_ids, 1))
    with psycopg.connect(postgres_database_url) as conn:
        row = conn.execute(
            "SELECT t.task, i.every, i.period FROM django_celery_beat_periodictask t "
            "JOIN django_celery_beat_intervalschedule i ON i.id = t.interval_id "
            "WHERE t.name = %s",
            (BEAT_ENTRY,),
        ).fetchone()
    assert row == (SWEEP_TASK, 1, "seconds")
