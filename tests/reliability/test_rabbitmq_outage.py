"""RabbitMQ killed (or shut down) during a stream of commits and retries, then restarted.

The broker is a throwaway RabbitMQ node (:mod:`tests.reliability.rabbit_server`; the
shared one is never stopped). The test process commits a stream of transactions, each
dispatching a few ``record`` tasks and one ``flaky`` task that fails one to three times
(retries ride on ETA messages, or are parked when they wait longer than
``outbox_park_after`` or when the broker refuses the ETA message). A worker with embedded
beat runs the tasks and the sweep throughout. Meanwhile the node is stopped (``kill``:
SIGKILL to its process group, a crash; ``shutdown``: ``rabbitmqctl shutdown``) and started
again, which takes the node 10-45 s here.

The outbox publishes with publisher confirms on RabbitMQ (``confirm_publish``): a row is
deleted only once the broker has confirmed its message, that is written a persistent
message of a durable queue to disk. So a SIGKILL loses nothing the outbox let go of, and
every committed dispatch must run (duplicates, from redeliveries of unacknowledged
messages, are counted, not failed).

Every ``COMMIT`` (with its on-commit publish) is timed, and so is each of its sends to the
broker (:meth:`~celery_outbox.publishing.producers.Producers.send`) and every message the broker
accepted (:meth:`~celery_outbox.publishing.broker.Deadline.progressed`). A send waits for a broker
that is down or stalls at most ``outbox_publish_timeout`` after the last message it
accepted (a broker that keeps accepting, slowly, is never cut): that wait must stay within
the setting, give or take the longest plain database ``COMMIT`` of the run (timed
alongside, on a table of its own), the measured jitter of this shared machine. The rest of
a ``COMMIT`` is database work (the commit itself, then marking or rescheduling the rows)
and CPU time: it is recorded (``max_commit_outside_sends_s``), not asserted, since on a
loaded 2-core machine it alone has passed a second.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

import pytest
from celery import Celery
from sqlalchemy import Column, Integer, MetaData, Table, func, insert, select
from sqlalchemy.orm import Session

from celery_outbox.publishing import broker
from celery_outbox.publishing.producers import Producers
from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore, outbox_table
from tests.conftest import StartWorker
from tests.reliability.app import FLAKY, RECORD, create_app, create_tables, expected_table
from tests.reliability.conftest import RecordResult
from tests.reliability.harness import (
    ScenarioEnv,
    Supervisor,
    done_tally,
    expected_keys,
    settle,
    swept_rows,
)
from tests.reliability.rabbit_server import ThrowawayRabbitMQ

pytestmark = pytest.mark.slow

#: Seconds of committing before the stop, of the node being down (before its restart,
#: which takes more), and after it is back.
BEFORE, OUTAGE, AFTER = 3.0, 5.0, 4.0
#: ``record`` tasks per transaction (plus one ``flaky``).
BATCH = 4
#: Settings of this scenario: retries waiting over 0.3 s are parked (the rest ride on ETAs).
CONF = {"outbox_park_after": 0.3, "outbox_publish_timeout": 1.0}

Outage = Literal["kill", "shutdown"]

_control_metadata = MetaData()
#: Plain database commits, timed beside the dispatching ones.
control_table = Table(
    "reliability_control_commit",
    _control_metadata,
    Column("id", Integer, primary_key=True, autoincrement=True),
)


def _outage(
    node: ThrowawayRabbitMQ,
    outage: Outage,
    done: threading.Event,
    marks: list[float],
    errors: list[BaseException],
) -> None:
    try:
        time.sleep(BEFORE)
        marks.append(time.monotonic())  # stopping
        node.stop(mode="kill" if outage == "kill" else "terminate")
        time.sleep(OUTAGE)
        node.start()
        marks.append(time.monotonic())  # back
        time.sleep(AFTER)
    except BaseException as error:  # the test fails with it, after the commits stop
        errors.append(error)
    finally:
        done.set()


@pytest.mark.parametrize("outage", ["kill", "shutdown"])
def test_rabbitmq_outage_during_commits_and_retries_loses_nothing_and_never_hangs(
    outage: Outage,
    monkeypatch: pytest.MonkeyPatch,
    celery_worker_process: StartWorker,
    throwaway_rabbitmq: ThrowawayRabbitMQ,
    postgres_database_url: str,
    make_scenario_env: Callable[..., ScenarioEnv],
    record_result: RecordResult,
) -> None:
    env = make_scenario_env(broker=throwaway_rabbitmq.url, db_url=postgres_database_url)
    app, store = create_app(
        broker=env.broker,
        db_url=env.db_url,
        queue=env.queue,
        ledger_dir=str(env.ledger_dir),
        **CONF,
    )
    create_tables(store.engine)
    _control_metadata.create_all(store.engine)
    _assert_publishes_with_confirms(app)
    timeout = float(app.conf["outbox_publish_timeout"])  # the setting the commits run under
    accepted, sends = _record_broker_waits(monkeypatch)
    worker_env = {**env.as_env(), "RELIABILITY_CONF": json.dumps(CONF)}
    supervisor = Supervisor(
        lambda: celery_worker_process(
            "tests.reliability.app",
            queue=env.queue,
            env=worker_env,
            pool="prefork",
            concurrency=2,
            extra_args=("-B",),
        )
    )
    done = threading.Event()
    marks: list[float] = []
    errors: list[BaseException] = []
    chaos = threading.Thread(target=_outage, args=(throwaway_rabbitmq, outage, done, marks, errors))
    chaos.start()
    publishes: list[float] = []
    commits: list[tuple[float, float]] = []
    stalls: list[float] = []  # per commit: the wait after the last accepted message
    controls: list[float] = []
    on_commit: list[tuple[int, bool]] = []  # (phase: 0 before, 1 down, 2 back, published)
    try:
        while not done.is_set():
            controls.append(_control_commit(store))
            phase = len(marks)
            started, ended, published = _commit_batch(app, store, len(publishes))
            commits.append((started, ended))
            publishes.append(ended - started)
            stalls.append(_wait_after_accepted(started, ended, accepted))
            on_commit.append((phase, published))
            time.sleep(0.02)
    finally:
        chaos.join()
    if errors:
        raise errors[0]

    expected = expected_keys(store.engine)

    def all_ran() -> bool:
        tally = done_tally(env, expected)
        supervisor.check(sum(tally.seen.values()))
        return not tally.lost

    settle(all_ran, timeout=180)
    tally = done_tally(env, expected)
    worst, worst_stall, worst_control = max(publishes), max(stalls), max(controls)
    worst_send = max(_wait_after_accepted(start, end, accepted) for start, end in sends)
    # Per commit, the time not spent in sends to the broker: database work, and the CPU
    # this shared machine gives the test process.
    outside = [
        (end - start) - sum(e - s for s, e in sends if start <= s and e <= end)
        for start, end in commits
    ]
    log = supervisor.worker.log_text()
    record_result(
        f"rabbitmq_{outage}_during_commits",
        title=(
            "Broker (RabbitMQ) SIGKILLed during a stream of commits and retries, then restarted"
            if outage == "kill"
            else "Broker (RabbitMQ) shut down during a stream of commits and retries, restarted"
        ),
        tasks=tally.tasks,
        lost=len(tally.lost),
        duplicates=tally.duplicates,
        notes=(
            f"{len(publishes)} commits of {BATCH} tasks + 1 flaky (1-3 failures, ETA and "
            f"parked retries); down {OUTAGE:.0f} s + restart; publisher confirms; worker -B"
        ),
        extra={
            "max_commit_publish_s": round(worst, 3),
            "max_commit_after_last_accepted_s": round(worst_stall, 3),
            "max_send_wait_after_last_accepted_s": round(worst_send, 3),
            "max_commit_outside_sends_s": round(max(outside), 3),
            "max_plain_commit_s": round(worst_control, 3),
            "outbox_publish_timeout_s": timeout,
            "p50_commit_publish_s": round(sorted(publishes)[len(publishes) // 2], 3),
            "published_on_commit_before_down_back": [
                f"{sum(ok for p, ok in on_commit if p == phase)}/"
                f"{sum(p == phase for p, _ in on_commit)}"
                for phase in range(3)
            ],
            "worker_restarts": supervisor.restarts,
            "swept": swept_rows(log),
        },
    )
    assert not tally.lost, tally.summary()
    assert not tally.phantoms, tally.summary()
    assert worst_send <= timeout + worst_control, (
        f"a commit waited {worst_send:.3f} s on a broker that accepted nothing ({outage}): "
        f"over outbox_publish_timeout = {timeout} s + the longest plain commit "
        f"{worst_control:.3f} s"
    )
    store.engine.dispose()


def _record_broker_waits(
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[list[float], list[tuple[float, float]]]:
    """When (monotonic) each message the broker accepted in this process was accepted, and
    when each send to the broker started and ended.
    """
    accepted: list[float] = []
    sends: list[tuple[float, float]] = []
    progressed, send = broker.Deadline.progressed, Producers.send

    def record_accepted(self: broker.Deadline) -> None:
        accepted.append(time.monotonic())
        progressed(self)

    def record_send(self: Producers, *args: Any, **kwargs: Any) -> Any:
        started = time.monotonic()
        try:
            return send(self, *args, **kwargs)
        finally:
            sends.append((started, time.monotonic()))

    monkeypatch.setattr(broker.Deadline, "progressed", record_accepted)
    monkeypatch.setattr(Producers, "send", record_send)
    return accepted, sends


def _wait_after_accepted(started: float, ended: float, accepted: list[float]) -> float:
    """Seconds from the last message accepted between ``started`` and ``ended`` (or from
    ``started``) to ``ended``.
    """
    return ended - max([started, *(t for t in accepted if started <= t <= ended)])


def _keys() -> list[tuple[str, int]]:
    return [("r", i) for i in range(BATCH)] + [("f", 0)]


def _commit_batch(
    app: Celery, store: SQLAlchemyOutboxStore, number: int
) -> tuple[float, float, bool]:
    """Commit one batch of dispatches; when its ``COMMIT`` (and publish) started and ended,
    and whether the on-commit publish got them all to the broker (no row left to sweep).
    """
    keys = [f"{kind}{number}-{i}" for kind, i in _keys()]
    with Session(store.engine) as session:
        with session.begin(), store.bind_session(session):
            session.execute(insert(expected_table), [{"key": key} for key in keys])
            for key in keys:
                if key.startswith("f"):
                    app.tasks[FLAKY].apply_async((key, 1 + number % 3), task_id=key)
                else:
                    app.tasks[RECORD].apply_async((key,), task_id=key)
            started = time.monotonic()
        ended = time.monotonic()
    with store.engine.connect() as conn:
        left = conn.execute(
            select(func.count()).where(outbox_table.c.task_id.in_(keys))
        ).scalar_one()
    return started, ended, left == 0


def _control_commit(store: SQLAlchemyOutboxStore) -> float:
    """The seconds a plain ``COMMIT`` of one inserted row takes now."""
    with Session(store.engine) as session:
        with session.begin():
            session.execute(insert(control_table))
            started = time.monotonic()
        return time.monotonic() - started


def _assert_publishes_with_confirms(app: Celery) -> None:
    """The outbox's broker connections ask RabbitMQ for publisher confirms."""
    conn: Any = broker.connect(app, broker.Deadline.after(timedelta(seconds=5)))
    try:
        assert conn.transport_options["confirm_publish"] is True
        assert conn.connection.confirm_publish is True  # py-amqp: confirm_select per channel
    finally:
        broker.discard(conn)
