"""The benchmark Celery app and its tasks, shared by the harness and its workers.

Everything comes from the environment so that a worker subprocess gets the harness's
broker, queue and settings: ``BENCH_REDIS_URL``, ``BENCH_BROKER_URL`` (default: that
Redis; ``--broker amqp`` sets RabbitMQ: ``BENCH_AMQP_URL``), ``BENCH_QUEUE``, ``BENCH_PREFETCH`` and
``BENCH_PUBLISH_GRACE``. Tasks report to Redis (keys prefixed with the queue name), so the
harness can count finished tasks and read task start times without a result backend.
"""

from __future__ import annotations

import os
import time
from typing import Any

import redis
from celery import Celery, Task

from celery_outbox import OutboxTask

#: Broker (and the tasks' report store): Redis database 11, left to the benchmarks.
REDIS_URL = os.environ.get("BENCH_REDIS_URL", "redis://127.0.0.1:6379/11")
#: The broker: Redis (above) unless ``BENCH_BROKER_URL`` names another (RabbitMQ).
BROKER_URL = os.environ.get("BENCH_BROKER_URL", REDIS_URL)
#: The queue of this run: every task is routed to it, and report keys start with it.
QUEUE = os.environ.get("BENCH_QUEUE", "celery-outbox-bench")
#: Seconds of (sleeping, I/O-like) work a healthy task does.
HEALTHY_WORK = 0.005
#: Backoff base (seconds) and retries of the failing tasks of the no-blocking benchmark.
FAILING_BACKOFF, FAILING_RETRIES = 0.25, 4
#: Countdown of the long retries of the memory benchmark.
LONG_RETRY = 3600

app = Celery("celery_outbox_bench", broker=BROKER_URL, set_as_current=True)
app.conf.update(
    task_default_queue=QUEUE,
    task_ignore_result=True,
    broker_connection_retry_on_startup=True,
    worker_hijack_root_logger=False,
    worker_prefetch_multiplier=int(os.environ.get("BENCH_PREFETCH", "4")),
    outbox_publish_grace=float(os.environ.get("BENCH_PUBLISH_GRACE", "10.0")),
    outbox_beat_schedule=False,
)

_reports: redis.Redis | None = None


def reports() -> redis.Redis:
    """The Redis client tasks report to (one per process)."""
    global _reports
    if _reports is None:
        _reports = redis.Redis.from_url(REDIS_URL)
    return _reports


def key(name: str) -> str:
    """The report key ``name`` of this run's queue."""
    return f"{QUEUE}:{name}"


class ProviderDown(Exception):
    """The failure every failing task raises."""


# -- enqueue and sweep: never run by a worker -----------------------------------------------
@app.task(name="bench.plain_noop")
def plain_noop(i: int) -> None:
    """A plain Celery task."""


@app.task(base=OutboxTask, name="bench.outbox_noop")
def outbox_noop(i: int) -> None:
    """The same task, dispatched through the outbox."""


# -- latency -------------------------------------------------------------------------------
def _record_start(task: Task[Any, Any]) -> None:
    reports().rpush(key("starts"), f"{task.request.id} {time.time()!r}")


@app.task(bind=True, name="bench.plain_started")
def plain_started(self: Task[Any, Any], i: int) -> None:
    """Record when it started (plain Celery)."""
    _record_start(self)


@app.task(bind=True, base=OutboxTask, name="bench.outbox_started")
def outbox_started(self: Task[Any, Any], i: int) -> None:
    """Record when it started (through the outbox)."""
    _record_start(self)


# -- no blocking ---------------------------------------------------------------------------
@app.task(name="bench.healthy")
def healthy(i: int) -> None:
    """A healthy task: a few milliseconds of I/O-like work, then count it."""
    time.sleep(HEALTHY_WORK)
    reports().incr(key("healthy"))


def sleep_schedule() -> list[float]:
    """The sleeps of a sleep-based retry loop: the midpoints of OutboxTask's windows."""
    windows = [(0.0, FAILING_BACKOFF)] + [
        (FAILING_BACKOFF * 2 ** (r - 1), FAILING_BACKOFF * 2**r) for r in range(1, FAILING_RETRIES)
    ]
    return [(low + high) / 2 for low, high in windows]


@app.task(name="bench.sleep_retry")
def sleep_retry(i: int) -> None:
    """Fail, sleep, try again in the same worker slot (tenacity style), then give up."""
    for pause in [*sleep_schedule(), None]:
        reports().incr(key("failing_attempts"))
        try:
            raise ProviderDown(i)
        except ProviderDown:
            if pause is None:
                break
            time.sleep(pause)
    reports().incr(key("failing_done"))


class _FailingTask(OutboxTask):
    autoretry_for = (ProviderDown,)
    max_retries = FAILING_RETRIES
    retry_backoff = FAILING_BACKOFF


@app.task(base=_FailingTask, name="bench.outbox_failing")
def outbox_failing(i: int) -> None:
    """Always fail: OutboxTask retries on its windows without sleeping, then dead-letters."""
    reports().incr(key("failing_attempts"))
    raise ProviderDown(i)


# -- observability -------------------------------------------------------------------------
class _FailsOnceTask(OutboxTask):
    autoretry_for = (ProviderDown,)
    retry_backoff = 0.01


@app.task(bind=True, base=_FailsOnceTask, name="bench.outbox_fails_once")
def outbox_fails_once(self: Task[Any, Any], i: int) -> None:
    """Fail the first attempt (an ETA retry within 10 ms), then succeed and count it."""
    if self.request.retries == 0:
        raise ProviderDown(i)
    reports().incr(key("succeeded"))


# -- retry memory ----------------------------------------------------------------------------
@app.task(bind=True, name="bench.plain_retry_long", max_retries=None)
def plain_retry_long(self: Task[Any, Any], i: int) -> Any:
    """Plain Celery: retry in an hour (an ETA message the worker holds)."""
    reports().incr(key("ran"))
    raise self.retry(countdown=LONG_RETRY)


@app.task(bind=True, base=OutboxTask, name="bench.outbox_retry_long", max_retries=None)
def outbox_retry_long(self: Task[Any, Any], i: int) -> Any:
    """OutboxTask: retry in an hour (parked in the outbox table)."""
    reports().incr(key("ran"))
    raise self.retry(countdown=LONG_RETRY)


# -- retry isolation -------------------------------------------------------------------------
#: The queue of the storm's retries with ``retry_queue`` (a worker of its own consumes it);
#: under this run's report prefix, so purging the run purges it too.
RETRY_QUEUE = f"{QUEUE}:retries"
#: The retry queue of :func:`storm_isolated_low` (its worker runs at a lower CPU priority).
LOW_RETRY_QUEUE = f"{QUEUE}:retries-low"
#: The healthy queue of the pinned pair of workers (its worker has core 0 to itself).
PINNED_QUEUE = f"{QUEUE}:pinned"
#: The retry queue of :func:`storm_pinned` (its worker has the last core to itself).
PINNED_RETRY_QUEUE = f"{QUEUE}:retries-pinned"
#: Backoff cap (seconds) of the storm tasks: from their fifth attempt on, each retries
#: every 2 s while the outage lasts (500 tasks: about 250 failing attempts a second).
STORM_BACKOFF_MAX = 2.0


def _storm(i: int) -> None:
    """Fail while the run's ``outage`` key is set; count the attempt, and the success."""
    reports().incr(key("storm_attempts"))
    if reports().exists(key("outage")):
        raise ProviderDown(i)
    reports().incr(key("storm_done"))


class _StormTask(OutboxTask):
    autoretry_for = (ProviderDown,)
    max_retries = None  # keep retrying until the outage ends
    retry_backoff = FAILING_BACKOFF
    retry_backoff_max = STORM_BACKOFF_MAX


@app.task(base=_StormTask, name="bench.storm_shared")
def storm_shared(i: int) -> None:
    """A storm task whose retries go back to the healthy tasks' queue."""
    _storm(i)


@app.task(base=_StormTask, name="bench.storm_isolated", retry_queue=RETRY_QUEUE)
def storm_isolated(i: int) -> None:
    """A storm task whose retries go to :data:`RETRY_QUEUE`."""
    _storm(i)


@app.task(base=_StormTask, name="bench.storm_isolated_low", retry_queue=LOW_RETRY_QUEUE)
def storm_isolated_low(i: int) -> None:
    """A storm task whose retries go to :data:`LOW_RETRY_QUEUE`."""
    _storm(i)


@app.task(base=_StormTask, name="bench.storm_pinned", retry_queue=PINNED_RETRY_QUEUE)
def storm_pinned(i: int) -> None:
    """A storm task whose retries go to :data:`PINNED_RETRY_QUEUE`."""
    _storm(i)
