"""A real sweeper process whose clock runs a minute ahead (libfaketime) against a producer.

The producer (this process, true clock) commits rows born leased to its on-commit
publisher for ``outbox_publish_grace`` (30 s) and parks a countdown of 45 s; before it
publishes, ``python -m tests.integration.sweep_process`` runs under
``faketime -f +60s``. By its own clock both leases ran out and the countdown is due;
by the database's clock (PostgreSQL's, which the store reads) neither is, so it
publishes only a row due an hour ago (the control: it can publish), and each row reaches
the broker exactly once, the born-leased ones from their producer.
Skipped when ``faketime`` (Debian's ``faketime`` package) is missing, unless
``OUTBOX_REQUIRE_SERVICES`` is set (CI installs it: ``.ci/run``).
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import pytest
from celery import Celery
from sqlalchemy.orm import Session

from celery_outbox.dispatch.envelope import build_message
from celery_outbox.registry import store_for
from celery_outbox.relay.relay import relay_for
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from celery_outbox.store.records import MessageStatus, StoredMessage
from tests import services
from tests.integration.sweep_app import (
    RECORD,
    conf_env,
    create_app,
    create_tables,
    insert_committed_rows,
)
from tests.integration.sweep_support import drain_task_ids
from tests.worker import REPO_ROOT, worker_env

AHEAD = "+60s"
HOUR = timedelta(hours=1)
#: A publish under libfaketime is slow: a generous timeout, so the sweeper can publish.
CONF = {"outbox_publish_grace": 30.0, "outbox_park_after": 30.0, "outbox_publish_timeout": 20.0}


def faketime() -> str:
    """The ``faketime`` command, checked to shift a Python process's clock by a minute."""
    command = shutil.which("faketime")
    if command is None:
        if services.services_required():
            pytest.fail("faketime is not installed (apt-get install faketime)")
        pytest.skip("faketime is not installed (Debian package faketime)")
    probe = "import time; print(time.time())"
    before = float(subprocess.check_output([sys.executable, "-c", probe], text=True))
    shifted = subprocess.check_output([command, "-f", AHEAD, sys.executable, "-c", probe])
    assert float(shifted) - before >= 55, "faketime did not shift the clock"
    return command


@pytest.fixture
def app(broker_url: str, broker_queue: str, postgres_database_url: str) -> Iterator[Celery]:
    create_tables(postgres_database_url)
    app = create_app(broker_url, broker_queue, postgres_database_url, **CONF)
    yield app
    relay_for(app).close()
    store_for(app).engine.dispose()  # type: ignore[attr-defined]
    app.close()


def commit_born_leased(app: Celery, count: int) -> list[StoredMessage]:
    """Rows as ``delay()`` writes them in a transaction, committed, their on-commit
    publisher not run yet; their records, as that publisher holds them.
    """
    store: SQLAlchemyOutboxStore = store_for(app)  # type: ignore[assignment]
    written = []
    with Session(store.engine) as session, session.begin(), store.bind_session(session):
        for n in range(count):
            message = build_message(
                app.tasks[RECORD],
                (n,),
                {},
                task_id=f"born-{n}",
                options={},
                now=store.now(),
                park_after=timedelta(seconds=30),
                max_bytes=None,
                lease=timedelta(seconds=30),
            )
            row_id = store.add(message)
            assert row_id is not None
            written.append(StoredMessage.written(message, row_id))
    return written


def test_a_sweeper_a_minute_ahead_publishes_nothing_twice_and_nothing_early(
    app: Celery, broker_url: str, broker_queue: str, postgres_database_url: str
) -> None:
    command = faketime()
    store = store_for(app)
    (due,) = insert_committed_rows(app, 1, created_at=store.now() - HOUR, prefix="due")
    born = commit_born_leased(app, 20)
    parked = app.tasks[RECORD].apply_async((99,), countdown=45, task_id="parked").id
    env = {
        "OUTBOX_TEST_BROKER": broker_url,
        "OUTBOX_TEST_QUEUE": broker_queue,
        "OUTBOX_TEST_DB": postgres_database_url,
        "OUTBOX_TEST_CONF": conf_env(CONF),
        # The wall clock is off, as on a host whose time is wrong; the monotonic clock
        # runs true (no wall-clock change moves it).
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }
    swept = subprocess.run(
        [command, "-f", AHEAD, sys.executable, "-m", "tests.integration.sweep_process"],
        cwd=REPO_ROOT,
        env=worker_env(env),
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    )
    # The one row due by the database's clock, and none of the others.
    assert json.loads(swept.stdout.splitlines()[-1])["published"] == 1

    report = relay_for(app).publish_committed(born)  # the producer's on-commit publisher
    assert len(report.published) == 20

    seen = drain_task_ids(broker_url, broker_queue)
    assert seen == Counter(dict.fromkeys([due, *(m.task_id for m in born)], 1))  # once each
    counts = store.count_by_status()
    assert counts[MessageStatus.PENDING] == 1  # the countdown: kept, not yet due
    assert parked not in seen
