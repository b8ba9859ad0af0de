"""The same dispatch on MariaDB/MySQL and SQLite, with a real broker and worker; the
atomic-task contract tests on both.

pytest-django runs on PostgreSQL, so these databases get processes of their own:
``migrate``, a worker and a dispatching client, all on ``tests.django.db_settings``.
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from tests.django.atomic_tasks import events
from tests.django.conftest import World
from tests.worker import REPO_ROOT, wait_for, worker_env


@pytest.fixture(params=["mysql", "sqlite"])
def other_database_url(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A fresh MariaDB database, or a fresh SQLite file."""
    if request.param == "mysql":
        return str(request.getfixturevalue("mysql_database_url"))
    return f"sqlite:///{tmp_path / 'outbox.sqlite3'}"


def run_django(module_args: list[str], env: dict[str, str], *, timeout: float = 120) -> str:
    """Run ``python -m ...`` on ``tests.django.db_settings``; return its stdout."""
    done = subprocess.run(
        [sys.executable, "-m", *module_args],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=timeout,
        env=worker_env({**env, "DJANGO_SETTINGS_MODULE": "tests.django.db_settings"}),
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_dispatch_commits_and_rolls_back_on_other_databases(
    world: World, celery_worker_process: Callable[..., Any], other_database_url: str
) -> None:
    env = {**world.env, "OUTBOX_DJANGO_DB_URL": other_database_url}
    run_django(["django", "migrate", "--noinput", "-v", "0"], env)
    celery_worker_process("tests.django.worker_app", queue=world.queue, env=env)
    outcome = json.loads(run_django(["tests.django.dispatch_client"], env))
    assert outcome["vendor"] == other_database_url.split(":")[0]
    assert (outcome["same_result"], outcome["rows_for_explicit_id"]) == (True, 1)
    assert outcome["rows_left"] == 0
    runs = world.wait_for_runs(3)
    assert [run["task_id"] for run in runs] == outcome["expected"]
    assert [run["saw_user"] for run in runs] == [True, True, False]


@pytest.mark.parametrize(
    "isolation", [None, "repeatable read"], ids=["default-isolation", "repeatable-read"]
)
def test_the_atomic_task_contract_holds_on_other_databases(
    other_database_url: str, isolation: str | None
) -> None:
    env = {"OUTBOX_DJANGO_DB_URL": other_database_url}
    if isolation is not None:
        if not other_database_url.startswith("mysql"):
            pytest.skip("SQLite has one isolation level")
        # Under REPEATABLE READ a duplicate must still see the row committed while it waited.
        env["OUTBOX_DJANGO_DB_OPTIONS"] = json.dumps({"isolation_level": isolation})
    outcome = json.loads(run_django(["tests.django.completions_client"], env))
    assert outcome["vendor"] == other_database_url.split(":")[0]
    failed = {name: text for name, text in outcome["tests"].items() if text != "passed"}
    assert failed == {}
    assert len(outcome["tests"]) >= 9  # every contract test ran, both cases of the race


@pytest.mark.parametrize(
    "isolation", [None, "repeatable read"], ids=["default-isolation", "repeatable-read"]
)
def test_workflow_rows_and_chord_joins_on_other_databases(
    other_database_url: str, isolation: str | None
) -> None:
    env = {"OUTBOX_DJANGO_DB_URL": other_database_url}
    if isolation is not None:
        if not other_database_url.startswith("mysql"):
            pytest.skip("SQLite has one isolation level")
        # Under REPEATABLE READ a header step must still see the parts committed before it.
        env["OUTBOX_DJANGO_DB_OPTIONS"] = json.dumps({"isolation_level": isolation})
    outcome = json.loads(run_django(["tests.django.workflows_client"], env))
    assert outcome["vendor"] == other_database_url.split(":")[0]
    failed = {name: text for name, text in outcome["tests"].items() if text != "passed"}
    assert failed == {}
    assert len(outcome["tests"]) >= 10


def test_the_atomic_task_contract_holds_on_postgresql_repeatable_read(
    postgres_database_url: str,
) -> None:
    # A duplicate that waited on the key gets a serialization failure at this level; the
    # store starts its transaction again, and it is then told about the first run.
    from psycopg import IsolationLevel

    env = {
        "OUTBOX_DJANGO_DB_URL": postgres_database_url,
        "OUTBOX_DJANGO_DB_OPTIONS": json.dumps(
            {"isolation_level": int(IsolationLevel.REPEATABLE_READ)}
        ),
    }
    outcome = json.loads(run_django(["tests.django.completions_client"], env))
    assert outcome["vendor"] == "postgresql"
    failed = {name: text for name, text in outcome["tests"].items() if text != "passed"}
    assert failed == {}


def test_atomic_tasks_run_once_on_other_databases(
    world: World, celery_worker_process: Callable[..., Any], other_database_url: str
) -> None:
    output = world.output.with_name(f"atomic-{uuid.uuid4().hex[:8]}.jsonl")
    env = {
        **world.env,
        "OUTBOX_DJANGO_DB_URL": other_database_url,
        "OUTBOX_TEST_OUTPUT": str(output),
    }
    run_django(["django", "migrate", "--noinput", "-v", "0"], env)
    celery_worker_process(
        "tests.django.atomic_worker", queue=world.queue, env=env, pool="prefork", concurrency=2
    )
    key = "k1"

    def seen(event: str, count: int) -> list[dict[str, Any]]:
        def enough() -> bool:
            if sum(e["event"] == event for e in events(output)) >= count:
                return True
            # A publish after commit may fail (SQLite: "database is locked" while the other
            # worker process writes); its row waits for a sweep, as with beat.
            run_django(["tests.django.atomic_client", "sweep", key], env)
            return False

        wait_for(enough, timeout=30, what=f"{count} {event} event(s)")
        return [e for e in events(output) if e["event"] == event]

    run_django(["tests.django.atomic_client", "start", key], env)
    seen("follow", 2)  # bump's, and flaky's second attempt's
    run_django(["tests.django.atomic_client", "again", key], env)
    (skipped,) = seen("skipped", 1)
    time.sleep(1.0)  # room for a duplicate run or follow-up to show up
    state = json.loads(run_django(["tests.django.atomic_client", "read", key], env))

    assert state["vendor"] == other_database_url.split(":")[0]
    assert skipped["id"] == f"bump-{key}"
    runs = [(e["task"], e.get("retries")) for e in events(output) if e["event"] == "run"]
    assert sorted(runs) == [("atomic.bump", 0), ("atomic.flaky", 0), ("atomic.flaky", 1)]
    assert len(seen("follow", 2)) == 2  # the failed attempt's follow-up rolled back
    assert state["counter"] == 2  # bump once, flaky once (its first attempt rolled back)
    # Each result is the counter its own run left: 1 and 2, in whichever order they ran.
    assert sorted(state["completed"]) == [f"bump-{key}", f"flaky-{key}"]
    assert sorted(state["completed"].values()) == [1, 2]
    assert state["outbox_rows"] == 0


def test_the_backlog_and_the_sweep_record_on_other_databases(other_database_url: str) -> None:
    env = {"OUTBOX_DJANGO_DB_URL": other_database_url}
    outcome = json.loads(run_django(["tests.django.monitoring_client"], env))
    assert outcome["vendor"] == other_database_url.split(":")[0]
    failed = {name: text for name, text in outcome["tests"].items() if text != "passed"}
    assert failed == {}
    assert len(outcome["tests"]) >= 10


def test_concurrent_same_id_dispatches_write_one_pending_row_on_other_databases(
    other_database_url: str,
) -> None:
    env = {"OUTBOX_DJANGO_DB_URL": other_database_url}
    # Many rounds of 8 threads, each with a connection of its own, on a shared machine.
    outcome = json.loads(run_django(["tests.django.dispatch_races_client"], env, timeout=600))
    vendor = other_database_url.split(":")[0]
    assert outcome["vendor"] == vendor
    # MariaDB: the key over the generated column (migration 0008); SQLite: the partial index.
    assert outcome["key"] == (["pending_task_id"] if vendor == "mysql" else ["task_id"])
    failed = {name: text for name, text in outcome["tests"].items() if text != "passed"}
    assert failed == {}
    assert len(outcome["tests"]) >= 20  # dispatch, superseding, and both races
