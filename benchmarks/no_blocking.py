"""Healthy throughput on a concurrency-2 worker while 20 tasks back off.

A prefork worker with two processes. Each case dispatches ``failing`` always-failing tasks
first (an outage starts), then ``healthy`` tasks (5 ms of I/O-like work each), and
measures healthy tasks/s from the first healthy dispatch to the last healthy finish:

- ``none``: no failing tasks (the reference);
- ``sleep``: failing tasks retry in place with ``time.sleep`` (tenacity style), on the
  midpoints of the same windows OutboxTask uses, holding their worker slot meanwhile;
- ``outbox``: failing ``OutboxTask``s (``retry_backoff=0.25``, 4 retries, then a dead
  letter) that re-schedule themselves on ETA messages and free the slot at once.

The ratio is each case's throughput over ``none``'s in the same round; medians of rounds.
"""

from __future__ import annotations

import time
from typing import Any

from benchmarks import env
from benchmarks.processes import start_worker, wait_until
from benchmarks.stats import median

#: Failing tasks backing off during each measurement.
FAILING = 20


def _case(kind: str, healthy: int, failing: int = FAILING) -> float:
    from benchmarks.app import healthy as healthy_task
    from benchmarks.app import outbox_failing, sleep_retry

    env.purge_broker()
    if kind == "sleep":
        for i in range(failing):
            sleep_retry.apply_async((i,))
    elif kind == "outbox":
        for i in range(failing):
            outbox_failing.delay(i)
    started = time.perf_counter()
    for i in range(healthy):
        healthy_task.apply_async((i,))
    wait_until(
        lambda: env.counter("healthy") >= healthy, timeout=600, what="healthy tasks", interval=0.01
    )
    elapsed = time.perf_counter() - started
    _wait_failing_done(kind, failing)
    return healthy / elapsed


def _wait_failing_done(kind: str, failing: int) -> None:
    # Let the failing tasks finish before the next case, so cases never overlap.
    if kind == "sleep":
        wait_until(
            lambda: env.counter("failing_done") >= failing, timeout=600, what="the sleeping tasks"
        )
    elif kind == "outbox":
        from benchmarks.app import FAILING_RETRIES

        wait_until(
            lambda: env.counter("failing_attempts") >= failing * (FAILING_RETRIES + 1),
            timeout=600,
            what="the failing tasks' retries",
        )
        time.sleep(0.5)  # the last attempts write their dead letters


def run(*, healthy: int, rounds: int, failing: int = FAILING) -> list[dict[str, Any]]:
    """Two result rows (sleep and outbox), as ratios to the no-failure throughput.

    ``failing`` tasks back off in each case (``FAILING`` for a measurement; ``--quick``
    uses fewer, as a harness check).
    """
    env.reset_outbox()
    worker = start_worker(pool="prefork", concurrency=2)
    try:
        _case("none", min(healthy, 200))  # warm-up
        samples: dict[str, list[float]] = {"none": [], "sleep": [], "outbox": []}
        for _ in range(rounds):
            for kind in samples:
                samples[kind].append(_case(kind, healthy, failing))
    finally:
        worker.stop()
        env.purge_broker()
        env.reset_outbox()
    base = median(samples["none"])
    rows = []
    for kind, label in (("sleep", "plain"), ("outbox", "ours")):
        ratios = [s / n for s, n in zip(samples[kind], samples["none"], strict=True)]
        rows.append(
            {
                "benchmark": "no blocking",
                "case": f"{failing} failing, {label}",
                "unit": "healthy tasks/s",
                "tasks": healthy,
                "rounds": rounds,
                "baseline": base,
                "value": median(samples[kind]),
                "ratio": median(ratios),
                "target": 0.95 if kind == "outbox" else None,
                "samples": {kind: samples[kind], "none": samples["none"]},
            }
        )
    return rows
