"""Real services for the test suite: where they are, whether they answer, what to do if not.

Each service is chosen by an ``OUTBOX_TEST_*_URL`` environment variable with a loopback default.
A service is probed once per process with a real connection and a short timeout. When it does not
answer, its tests are skipped, unless ``OUTBOX_REQUIRE_SERVICES=1`` (CI), which makes them fail:
a CI run must never pass by skipping (STYLE.md section 7).
"""

from __future__ import annotations

import os
import socket
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING
from urllib.parse import unquote, urlsplit, urlunsplit

import pytest

if TYPE_CHECKING:
    from pymysql.connections import Connection as MySQLConnection

#: Set to ``1`` to turn an unreachable service into a test failure instead of a skip.
REQUIRE_ENV = "OUTBOX_REQUIRE_SERVICES"

#: Seconds a reachability probe may take before the service counts as unreachable.
PROBE_TIMEOUT = 3


@dataclass(frozen=True, kw_only=True)
class Service:
    """A server the tests can use: its name, the variable choosing it and its default URL."""

    name: str
    env_var: str
    default_url: str

    @property
    def url(self) -> str:
        """The URL from the environment, or the loopback default."""
        return os.environ.get(self.env_var) or self.default_url


@dataclass(frozen=True, kw_only=True)
class DatabaseParams:
    """The parts of a database URL that drivers and Django settings need."""

    scheme: str
    host: str
    port: int | None
    user: str
    password: str
    name: str


@dataclass(frozen=True, kw_only=True)
class ProbeResult:
    """What one reachability probe found: ``error`` is ``None`` when the service answered."""

    service: Service
    url: str
    error: str | None

    @property
    def reachable(self) -> bool:
        """Whether the service answered the probe."""
        return self.error is None


SERVICES: dict[str, Service] = {
    "postgres": Service(
        name="postgres",
        env_var="OUTBOX_TEST_POSTGRES_URL",
        default_url="postgresql://postgres@127.0.0.1:5432/test",
    ),
    "redis": Service(
        name="redis", env_var="OUTBOX_TEST_REDIS_URL", default_url="redis://127.0.0.1:6379/0"
    ),
    "amqp": Service(
        name="amqp",
        env_var="OUTBOX_TEST_AMQP_URL",
        default_url="amqp://guest:guest@127.0.0.1:5672//",
    ),
    "mysql": Service(
        name="mysql",
        env_var="OUTBOX_TEST_MYSQL_URL",
        default_url="mysql://root@127.0.0.1:3306/test",
    ),
}


def services_required() -> bool:
    """Whether ``OUTBOX_REQUIRE_SERVICES`` asks for unreachable services to fail the run."""
    return os.environ.get(REQUIRE_ENV, "").strip().lower() in {"1", "true", "yes"}


def parse_db_url(url: str) -> DatabaseParams:
    """Split ``scheme://user:password@host:port/name`` into its parts (percent-decoded)."""
    parts = urlsplit(url)
    return DatabaseParams(
        scheme=parts.scheme.split("+", 1)[0],
        host=parts.hostname or "",
        port=parts.port,
        user=unquote(parts.username or ""),
        password=unquote(parts.password or ""),
        name=unquote(parts.path.lstrip("/")),
    )


def with_db_name(url: str, name: str) -> str:
    """The same server URL pointing at the database ``name``."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(path=f"/{name}"))


def mask_password(url: str) -> str:
    """The URL with its password replaced by ``***``, for messages."""
    parts = urlsplit(url)
    if not parts.password:
        return url
    netloc = parts.netloc.replace(f":{parts.password}@", ":***@", 1)
    return urlunsplit(parts._replace(netloc=netloc))


def unique_name(prefix: str) -> str:
    """A name no other test (or test run) uses: ``prefix`` plus 12 random hex digits."""
    return f"{prefix}{uuid.uuid4().hex[:12]}"


def create_postgres_database(url: str, name: str) -> None:
    """Create database ``name`` on the server of ``url`` (connecting to ``postgres``)."""
    import psycopg
    from psycopg import sql

    admin_url = with_db_name(url, "postgres")
    with psycopg.connect(admin_url, connect_timeout=PROBE_TIMEOUT, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))


def drop_postgres_database(url: str, name: str) -> None:
    """Drop database ``name``, disconnecting whoever still uses it (PostgreSQL 13+)."""
    import psycopg
    from psycopg import sql

    admin_url = with_db_name(url, "postgres")
    with psycopg.connect(admin_url, connect_timeout=PROBE_TIMEOUT, autocommit=True) as conn:
        statement = sql.SQL("DROP DATABASE IF EXISTS {} WITH (FORCE)")
        conn.execute(statement.format(sql.Identifier(name)))


def check_postgres(url: str) -> None:
    """Connect and run ``SELECT 1``; create the URL's database first if it is missing."""
    import psycopg

    try:
        conn = psycopg.connect(url, connect_timeout=PROBE_TIMEOUT)
    except psycopg.OperationalError as exc:
        if "does not exist" not in str(exc):
            raise
        create_postgres_database(url, parse_db_url(url).name)
        conn = psycopg.connect(url, connect_timeout=PROBE_TIMEOUT)
    with conn:
        conn.execute("SELECT 1")


def check_redis(url: str) -> None:
    """Send ``PING`` with the redis client, without its connection retries."""
    import redis
    from redis.backoff import NoBackoff
    from redis.retry import Retry

    client = redis.Redis.from_url(
        url,
        socket_connect_timeout=PROBE_TIMEOUT,
        socket_timeout=PROBE_TIMEOUT,
        retry=Retry(NoBackoff(), 0),
    )
    try:
        client.ping()
    finally:
        client.close()


def check_amqp(url: str) -> None:
    """Open (and close) one AMQP connection through kombu, without retries."""
    from kombu import Connection

    with Connection(url, connect_timeout=PROBE_TIMEOUT) as conn:
        conn.ensure_connection(max_retries=0)


def _mysql_connect(url: str, *, database: str | None) -> MySQLConnection:
    import pymysql

    params = parse_db_url(url)
    return pymysql.connect(
        host=params.host or "127.0.0.1",
        port=params.port or 3306,
        user=params.user or "root",
        password=params.password,
        database=database,
        connect_timeout=PROBE_TIMEOUT,
        autocommit=True,
    )


def create_mysql_database(url: str, name: str) -> None:
    """Create database ``name`` (utf8mb4) on the server of ``url`` if it does not exist."""
    conn = _mysql_connect(url, database=None)
    try:
        with conn.cursor() as cursor:
            cursor.execute(f"CREATE DATABASE IF NOT EXISTS `{name}` CHARACTER SET utf8mb4")
    finally:
        conn.close()


def drop_mysql_database(url: str, name: str) -> None:
    """Drop database ``name`` on the server of ``url`` if it exists."""
    conn = _mysql_connect(url, database=None)
    try:
        with conn.cursor() as cursor:
            cursor.execute(f"DROP DATABASE IF EXISTS `{name}`")
    finally:
        conn.close()


def check_mysql(url: str) -> None:
    """Connect with pymysql and run ``SELECT 1``; create the URL's database if it is missing."""
    name = parse_db_url(url).name
    if name:
        create_mysql_database(url, name)
    conn = _mysql_connect(url, database=name or None)
    try:
        with conn.cursor() as cursor:
            cursor.execute("SELECT 1")
    finally:
        conn.close()


CHECKS: dict[str, Callable[[str], None]] = {
    "postgres": check_postgres,
    "redis": check_redis,
    "amqp": check_amqp,
    "mysql": check_mysql,
}


_RESULTS: dict[str, ProbeResult] = {}


def probe(name: str) -> ProbeResult:
    """Probe service ``name`` once per process; later calls return the first answer."""
    if name not in _RESULTS:
        _RESULTS[name] = _run_check(SERVICES[name])
    return _RESULTS[name]


def _run_check(service: Service) -> ProbeResult:
    url = service.url
    try:
        CHECKS[service.name](url)
    except Exception as exc:  # any failure (driver missing, refused, auth) means unusable
        error = " ".join(f"{type(exc).__name__}: {exc}".split())  # one line, for the summary
        return ProbeResult(service=service, url=url, error=error)
    return ProbeResult(service=service, url=url, error=None)


def probed_unreachable() -> list[ProbeResult]:
    """The services probed so far in this process that did not answer."""
    return [result for result in _RESULTS.values() if not result.reachable]


def require_service(name: str) -> str:
    """The URL of service ``name``; skip the test if it is unreachable, or fail in CI.

    Raises
    ------
    pytest.skip.Exception
        The service does not answer and ``OUTBOX_REQUIRE_SERVICES`` is not set.
    pytest.fail.Exception
        The service does not answer and ``OUTBOX_REQUIRE_SERVICES=1``.
    """
    result = probe(name)
    if result.reachable:
        return result.url
    message = (
        f"{name} unreachable at {mask_password(result.url)} "
        f"(set {result.service.env_var}): {result.error}"
    )
    if services_required():
        pytest.fail(f"{REQUIRE_ENV}=1 but {message}", pytrace=False)
    pytest.skip(message)


def summary_lines() -> list[str]:
    """One line per unreachable service, for the end-of-run summary."""
    outcome = f"tests FAILED ({REQUIRE_ENV}=1)" if services_required() else "tests were skipped"
    return [
        f"celery-outbox: service {result.service.name} unreachable at "
        f"{mask_password(result.url)} ({result.error}); its {outcome}. "
        f"Start it or set {result.service.env_var}."
        for result in probed_unreachable()
    ]


def free_port() -> int:
    """A loopback TCP port nothing listens on right now: a server that is down, or the port of a
    throwaway one a test is about to start.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])
