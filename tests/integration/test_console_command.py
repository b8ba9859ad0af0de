"""``celery -A app outbox status|health|sweep`` on the SQLAlchemy store, from a subprocess as
a user runs it, on PostgreSQL and SQLite with a real Redis: output, exit codes, the errors.
"""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta, timezone

import pytest
from sqlalchemy import create_engine
from sqlalchemy.engine import make_url

from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, metadata
from tests.brokers import delete_queue, new_queue_name, purge_queue
from tests.contract.factories import new_message
from tests.services import free_port
from tests.worker import REPO_ROOT

APP = "tests.integration.console_app"


def without_django(environ: Mapping[str, str]) -> dict[str, str]:
    """The environment of a process that is no Django project (pytest-django sets one)."""
    return {key: value for key, value in environ.items() if key != "DJANGO_SETTINGS_MODULE"}


@dataclass
class Console:
    db: str
    broker: str
    queue: str

    def run(self, *args: str, db: str | None = None) -> subprocess.CompletedProcess[str]:
        env = without_django(os.environ)
        env.update(
            OUTBOX_CONSOLE_DB=db or self.db,
            OUTBOX_CONSOLE_BROKER=self.broker,
            OUTBOX_CONSOLE_QUEUE=self.queue,
            PYTHONPATH=str(REPO_ROOT),
        )
        return subprocess.run(
            [sys.executable, "-m", "celery", "-A", APP, "outbox", *args],
            env=env,
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            timeout=120,
            stdin=subprocess.DEVNULL,
        )

    def leave_due_row(self) -> str:
        """A row due an hour ago that nobody publishes (as a crashed producer leaves it)."""
        engine = create_engine(self.db)
        try:
            message = new_message(
                task_name="console_app.echo",
                available_at=datetime.now(timezone.utc) - timedelta(hours=1),
            )
            message = dataclasses.replace(
                message, options={**message.options, "routing_key": self.queue}
            )
            SQLAlchemyOutboxStore(engine=engine).add(message)
        finally:
            engine.dispose()
        return message.task_id


@pytest.fixture(params=["sqlite", pytest.param("postgresql", marks=pytest.mark.postgres)])
def console(request: pytest.FixtureRequest, sqlite_url: str, redis_url: str) -> Iterator[Console]:
    if request.param == "sqlite":
        url = sqlite_url
    else:
        raw = request.getfixturevalue("postgres_database_url")
        url = make_url(raw).set(drivername="postgresql+psycopg").render_as_string(False)
    engine = create_engine(url)
    metadata.create_all(engine)
    engine.dispose()
    queue = new_queue_name()
    yield Console(db=url, broker=redis_url, queue=queue)
    delete_queue(redis_url, queue)


def test_status_counts_a_due_row_in_text_and_json(console: Console) -> None:
    console.leave_due_row()

    text = console.run("status")
    data = console.run("status", "--json")

    assert text.returncode == 0, text.stderr
    assert "database default:" in text.stdout
    assert "pending            1  (due now)" in text.stdout
    assert data.returncode == 0, data.stderr
    status = json.loads(data.stdout)["default"]
    assert (status["pending"], status["parked"], status["failed"]) == (1, 0, 0)
    assert status["oldest_pending_age_seconds"] >= 3600 - 60
    assert status["last_sweep_age_seconds"] is None


def test_sweep_publishes_the_row_and_health_then_passes(console: Console) -> None:
    console.leave_due_row()
    unhealthy = console.run("health", "--max-pending-age", "60")

    time.sleep(0.6)  # past outbox_publish_grace: the row is the sweep's
    swept = console.run("sweep")
    healthy = console.run("health", "--max-pending-age", "60")

    assert unhealthy.returncode == 1
    assert "waiting" in unhealthy.stderr or "pending" in unhealthy.stderr
    assert swept.returncode == 0, swept.stderr
    assert swept.stdout.strip() == "default: published 1, rescheduled 0, failed 0 in 1 batch(es)"
    assert purge_queue(console.broker, console.queue) == 1  # the row's message, once
    assert healthy.returncode == 0, healthy.stderr
    assert healthy.stdout.strip() == "healthy: default"
    assert json.loads(console.run("status", "--json").stdout)["default"]["pending"] == 0


@pytest.mark.parametrize("value", ["-3", "0", "nan", "soon", "700000"])
def test_a_bad_age_is_refused_naming_it_with_exit_2(console: Console, value: str) -> None:
    refused = console.run("health", "--max-pending-age", value)

    assert refused.returncode == 2
    assert f"'{value}' is not accepted: give 0.001 to 604800 seconds." in refused.stderr
    assert "Traceback" not in refused.stderr


def test_a_database_that_is_down_is_a_clear_error_with_exit_2(console: Console) -> None:
    down = f"postgresql+psycopg://postgres@127.0.0.1:{free_port()}/x"

    for args in (("status",), ("sweep",)):
        result = console.run(*args, db=down)
        assert result.returncode == 2, (args, result.stdout, result.stderr)
        assert result.stderr.startswith(f"outbox: {args[0]}: database default:")
        assert "Traceback" not in result.stderr


def test_an_app_without_a_store_is_told_how_to_install_one() -> None:
    env = without_django(os.environ)
    env["PYTHONPATH"] = str(REPO_ROOT)
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "tests.integration.console_nostore_app",
            "outbox",
            "status",
        ],
        env=env,
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        stdin=subprocess.DEVNULL,
    )

    assert result.returncode == 2
    assert "no outbox store is installed on this app" in result.stderr
    assert "install_store" in result.stderr
    assert "Traceback" not in result.stderr
