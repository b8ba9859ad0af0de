"""Fixtures for real services, per-test broker queues and real Celery workers.

Service fixtures skip their test when the service does not answer, or fail it when
``OUTBOX_REQUIRE_SERVICES=1``; the run ends with one summary line per missing service.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests import services
from tests.brokers import MEMORY_BROKER_URL, delete_queue, new_queue_name
from tests.worker import SharedWorker, WorkerProcess, WorkerStarter

#: Fixture name -> the marker a test using it gets (fixture closures count too).
FIXTURE_MARKERS: dict[str, str] = {
    "postgres_url": "postgres",
    "redis_url": "redis",
    "amqp_url": "amqp",
    "mysql_url": "mysql",
}

#: pytest-django fixtures that need the Django test database.
DJANGO_DB_FIXTURES = frozenset({"db", "transactional_db", "django_db_setup", "live_server"})

#: Plugin name -> the ini keys pyproject sets for it, accepted (and unused) without it.
OPTIONAL_PLUGIN_INI_KEYS: dict[str, tuple[str, ...]] = {
    "django": ("DJANGO_SETTINGS_MODULE", "django_find_project"),
    "timeout": ("timeout",),
}

StartWorker = Callable[..., WorkerProcess]


def pytest_addoption(parser: pytest.Parser, pluginmanager: pytest.PytestPluginManager) -> None:
    """Accept the ini keys of absent plugins (``core`` env, ``-p no:django``, no pytest-timeout)."""
    for plugin, keys in OPTIONAL_PLUGIN_INI_KEYS.items():
        if not pluginmanager.has_plugin(plugin):
            for key in keys:
                parser.addini(key, f"{plugin} option, unused: the plugin is not active")


def pytest_configure(config: pytest.Config) -> None:
    """Register the service markers when pyproject's list is not in use (``-p tests.conftest``)."""
    declared = {line.split(":", 1)[0] for line in config.getini("markers")}
    for marker in sorted(set(FIXTURE_MARKERS.values()) - declared):
        config.addinivalue_line("markers", f"{marker}: needs a real {marker} service")


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    """Mark every test with the services its fixtures need (``-m 'not amqp'`` deselects)."""
    for item in items:
        for marker in _service_markers(item):
            item.add_marker(marker)


def _service_markers(item: pytest.Item) -> set[str]:
    names = set(getattr(item, "fixturenames", ()))
    markers = {marker for fixture, marker in FIXTURE_MARKERS.items() if fixture in names}
    if _uses_django_db(item, names) and django_db_is_postgres():
        markers.add("postgres")
    return markers


def _uses_django_db(item: pytest.Item, fixturenames: set[str]) -> bool:
    return (
        bool(fixturenames & DJANGO_DB_FIXTURES) or item.get_closest_marker("django_db") is not None
    )


def django_db_is_postgres() -> bool:
    """Whether Django tests use PostgreSQL (default), not ``OUTBOX_TEST_DJANGO_DB=sqlite``."""
    return os.environ.get("OUTBOX_TEST_DJANGO_DB", "postgres").lower() != "sqlite"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter) -> None:
    """Print one line per service that was needed but did not answer.

    Under pytest-xdist the probes ran in the worker processes: the controller probes again
    each service a skipped or failed test names as unreachable.
    """
    reports = [
        *terminalreporter.stats.get("skipped", ()),
        *terminalreporter.stats.get("failed", ()),
    ]
    for name in services.SERVICES:
        if any(f"{name} unreachable at" in str(getattr(r, "longrepr", "")) for r in reports):
            services.probe(name)
    for line in services.summary_lines():
        terminalreporter.write_line(line, yellow=not services.services_required(), bold=True)


# --- services -------------------------------------------------------------------------------


@pytest.fixture(scope="session")
def postgres_url() -> str:
    """URL of a reachable PostgreSQL database (``OUTBOX_TEST_POSTGRES_URL``)."""
    return services.require_service("postgres")


@pytest.fixture(scope="session")
def redis_url() -> str:
    """URL of a reachable Redis (``OUTBOX_TEST_REDIS_URL``), usable as a Celery broker."""
    return services.require_service("redis")


@pytest.fixture(scope="session")
def amqp_url() -> str:
    """URL of a reachable RabbitMQ (``OUTBOX_TEST_AMQP_URL``), usable as a Celery broker."""
    return services.require_service("amqp")


@pytest.fixture(scope="session")
def mysql_url() -> str:
    """URL of a reachable MySQL/MariaDB database (``OUTBOX_TEST_MYSQL_URL``)."""
    return services.require_service("mysql")


@pytest.fixture(
    scope="session",
    params=[
        pytest.param("redis", marks=pytest.mark.redis, id="redis"),
        pytest.param("amqp", marks=pytest.mark.amqp, id="amqp"),
    ],
)
def broker_url(request: pytest.FixtureRequest) -> str:
    """A real broker URL; a test using it runs once on Redis and once on RabbitMQ."""
    return services.require_service(str(request.param))


@pytest.fixture(scope="session")
def memory_broker_url() -> str:
    """The no-server broker: kombu's in-memory transport (one process only)."""
    return MEMORY_BROKER_URL


@pytest.fixture
def sqlite_url(tmp_path: Path) -> str:
    """The no-server database: an SQLAlchemy URL of a fresh SQLite file for this test."""
    return f"sqlite:///{tmp_path / 'outbox.sqlite3'}"


@pytest.fixture
def postgres_database_url(postgres_url: str) -> Iterator[str]:
    """URL of a fresh, empty PostgreSQL database of this test's own, dropped afterwards.

    For tests whose other processes (workers) must see committed rows, where a rolled-back
    transaction cannot isolate tests from each other.
    """
    name = services.unique_name("outbox_test_")
    services.create_postgres_database(postgres_url, name)
    yield services.with_db_name(postgres_url, name)
    services.drop_postgres_database(postgres_url, name)


@pytest.fixture
def mysql_database_url(mysql_url: str) -> Iterator[str]:
    """URL of a fresh, empty MySQL/MariaDB database of this test's own, dropped afterwards."""
    name = services.unique_name("outbox_test_")
    services.create_mysql_database(mysql_url, name)
    yield services.with_db_name(mysql_url, name)
    services.drop_mysql_database(mysql_url, name)


@pytest.fixture(scope="session")
def django_db_service() -> None:
    """Skip (or, with ``OUTBOX_REQUIRE_SERVICES=1``, fail) when Django's PostgreSQL is down."""
    if django_db_is_postgres():
        services.require_service("postgres")


@pytest.fixture(scope="session")
def django_db_setup(django_db_service: None, django_db_setup: None) -> None:
    """pytest-django's test database setup, once the database service is known to answer.

    Overrides pytest-django's fixture (requested as the argument of the same name), so the
    service rule holds for every Django test, in ``tests/django`` and ``tests/contract`` alike.
    """


# --- queues and workers ---------------------------------------------------------------------


@pytest.fixture
def queue_name(request: pytest.FixtureRequest) -> Iterator[str]:
    """A queue name unique to this test, so tests never consume each other's messages.

    When the test also uses ``broker_url``, the queue (and its messages) is deleted from that
    broker afterwards.
    """
    name = new_queue_name()
    broker = request.getfixturevalue("broker_url") if "broker_url" in request.fixturenames else None
    yield name
    if broker is not None:
        delete_queue(broker, name)


@pytest.fixture
def broker_queue(broker_url: str, queue_name: str) -> str:
    """``queue_name`` on ``broker_url``: a fresh queue there, deleted after the test."""
    return queue_name


@pytest.fixture
def celery_worker_process(tmp_path: Path) -> Iterator[StartWorker]:
    """Factory: start real ``celery worker`` subprocesses; all are stopped at teardown.

    Call it as ``start(app_module, *, queue, env=None, pool="solo", concurrency=1,
    ready_timeout=60.0, extra_args=())``; it returns a ready
    :class:`tests.worker.WorkerProcess` (``pid``, ``log_path``, ``stop()``, ``kill()``).
    ``env`` is added to this process's environment, so the app module can read its broker,
    database and queue from it.
    """
    starter = WorkerStarter(tmp_path)
    yield starter
    starter.stop_all()


@pytest.fixture(scope="module")
def shared_worker(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SharedWorker]:
    """A :class:`SharedWorker` of this module (stopped after its last test)."""
    shared = SharedWorker(tmp_path_factory.mktemp("shared-worker"))
    yield shared
    shared.stop()


@pytest.fixture(scope="module")
def module_broker_queue(broker_url: str) -> Iterator[str]:
    """A queue of this module on ``broker_url`` (for a :func:`shared_worker`), deleted after."""
    name = new_queue_name()
    yield name
    delete_queue(broker_url, name)
