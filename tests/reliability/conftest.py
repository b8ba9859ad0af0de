"""Fixtures of the reliability tests: throwaway servers, the scenario environment, results.

``throwaway_redis`` and ``throwaway_postgres`` start servers of the test's own on free
ports (never the shared services), which the test may stop and start; they are killed
at teardown whatever happened. ``throwaway_rabbitmq`` does the same for a RabbitMQ node,
once per module (a node takes 10-45 s to boot). ``record_result`` writes a scenario's
measured counts to ``results.json``, which ``python -m tests.reliability.report`` renders into
``docs/reliability.md``.
"""

from __future__ import annotations

import shutil
import tempfile
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest

from tests.brokers import delete_queue
from tests.reliability import results
from tests.reliability.harness import ScenarioEnv, sqlalchemy_url
from tests.reliability.rabbit_server import ThrowawayRabbitMQ
from tests.reliability.servers import ServerUnavailable, ThrowawayPostgres, ThrowawayRedis
from tests.services import services_required

RecordResult = Callable[..., None]


def _unavailable(exc: ServerUnavailable) -> None:
    if services_required():
        pytest.fail(f"throwaway server unavailable: {exc}", pytrace=False)
    pytest.skip(f"throwaway server unavailable: {exc}")


@pytest.fixture
def throwaway_redis(tmp_path: Path) -> Iterator[ThrowawayRedis]:
    """A running Redis of this test's own (``.url``, ``.stop()``, ``.start()``, ``.freeze()``)."""
    try:
        server = ThrowawayRedis(tmp_path / "redis")
        server.start()
    except ServerUnavailable as exc:
        _unavailable(exc)
        raise
    try:
        yield server
    finally:
        server.close()


@pytest.fixture
def throwaway_postgres() -> Iterator[ThrowawayPostgres]:
    """A running PostgreSQL cluster of this test's own (``.url``, ``.stop()``, ``.start()``).

    Its directory is made directly under the system temporary directory, not pytest's
    ``tmp_path`` (which only root may enter), so that the ``postgres`` OS user can own it.
    """
    workdir = Path(tempfile.mkdtemp(prefix="outbox-reliability-pg-"))
    try:
        server = ThrowawayPostgres(workdir)
        server.start()
    except ServerUnavailable as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        _unavailable(exc)
        raise
    try:
        yield server
    finally:
        server.close()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture(scope="module")
def throwaway_rabbitmq() -> Iterator[ThrowawayRabbitMQ]:
    """A running RabbitMQ node of this module's own (``.url``, ``.stop()``, ``.start()``)."""
    workdir = Path(tempfile.mkdtemp(prefix="outbox-reliability-rabbitmq-"))
    try:
        server = ThrowawayRabbitMQ(workdir)
        server.start()
    except ServerUnavailable as exc:
        shutil.rmtree(workdir, ignore_errors=True)
        _unavailable(exc)
        raise
    try:
        yield server
    finally:
        server.close()
        shutil.rmtree(workdir, ignore_errors=True)


@pytest.fixture
def make_scenario_env(tmp_path: Path, queue_name: str) -> Callable[..., ScenarioEnv]:
    """Factory: ``make(broker=..., db_url=...)`` gives a :class:`ScenarioEnv` of this test."""

    def make(*, broker: str, db_url: str) -> ScenarioEnv:
        ledger_dir = tmp_path / "ledger"
        ledger_dir.mkdir(exist_ok=True)
        return ScenarioEnv(
            broker=broker,
            db_url=sqlalchemy_url(db_url),
            queue=queue_name,
            ledger_dir=ledger_dir,
            beat_schedule=tmp_path / "beat-schedule",
        )

    return make


@pytest.fixture
def record_result() -> RecordResult:
    """Record a scenario's counts in ``results.json`` (before the test asserts on them)."""

    def record(
        scenario: str,
        *,
        title: str,
        tasks: int,
        lost: int,
        duplicates: int,
        notes: str = "",
        extra: Mapping[str, Any] | None = None,
    ) -> None:
        results.record(
            results.ScenarioResult(
                scenario=scenario,
                title=title,
                tasks=tasks,
                lost=lost,
                duplicates=duplicates,
                notes=notes,
                extra=dict(extra or {}),
            )
        )

    return record


@pytest.fixture
def amqp_queue(amqp_url: str, queue_name: str) -> Iterator[str]:
    """``queue_name`` on the shared RabbitMQ; deleted with its messages afterwards."""
    yield queue_name
    delete_queue(amqp_url, queue_name)


@pytest.fixture
def redis_queue(redis_url: str, queue_name: str) -> Iterator[str]:
    """``queue_name`` on the shared Redis; deleted with its messages afterwards."""
    yield queue_name
    delete_queue(redis_url, queue_name)
