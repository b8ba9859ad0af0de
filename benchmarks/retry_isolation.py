"""Healthy throughput while 500 tasks keep failing and retrying, with and without
``retry_queue`` (issue 20, "retry isolation").

Two prefork workers run through every case: the healthy tasks' worker (concurrency 2, on
this run's queue, as in the no-blocking benchmark) and a retry worker (concurrency 2, on
:data:`benchmarks.app.RETRY_QUEUE` only), idle unless retries are sent to it. Each case
starts an outage (a Redis key the storm tasks read), dispatches ``storm`` ``OutboxTask``s
that fail while it lasts (``retry_backoff=0.25``, capped at 2 s, no retry limit), waits
until they have failed three times each on average (the storm is retrying on its windows),
then dispatches ``healthy`` tasks (5 ms of I/O-like work each) and measures healthy
tasks/s from the first healthy dispatch to the last healthy finish. Then the outage ends
and every storm task succeeds once before the next case:

- ``none``: no storm (the reference);
- ``shared``: the storm's retries go back to the healthy tasks' queue (no ``retry_queue``);
- ``isolated``: the storm's retries go to the retry queue (``retry_queue``), where only
  the retry worker takes them. Their first attempts still arrive on the healthy queue,
  before the measurement starts;
- ``isolated_low``: the same, with a retry worker of its own (on another retry queue)
  running at ``nice`` 10: when the retry workers share the healthy worker's cores, the
  kernel gives the healthy worker the CPU first;
- ``pinned``: each worker on a core of its own, as workers on machines (or CPU quotas)
  of their own would be: a second pair of workers, the healthy one confined to core 0
  and the retry one to the last core (``taskset``), with the storm's first attempts and
  the healthy tasks on the pair's healthy queue. Its reference is ``none_pinned``: the
  same pinned healthy worker with no storm. PostgreSQL, Redis and this process still
  share both cores with them.

The ratio is each case's throughput over its reference's in the same round (``none``,
or ``none_pinned``); medians of rounds. Outside ``pinned`` the workers share the
machine's cores: on 2 cores the retry worker's CPU is taken from the healthy worker too,
which the ratio includes.
"""

from __future__ import annotations

import os
import time
from typing import Any

from benchmarks import env
from benchmarks.processes import start_worker, wait_until
from benchmarks.stats import median

#: Tasks failing and retrying during each measurement.
STORM = 500
#: Failing attempts per storm task before the healthy tasks are dispatched.
WARM_ATTEMPTS = 3
#: The cases, in the order each round runs them, and their labels.
CASES = {
    "none": "no failures",
    "shared": "without retry_queue",
    "isolated": "with retry_queue",
    "isolated_low": "with retry_queue, its worker at nice 10",
    "none_pinned": "no failures, the healthy worker on a core of its own",
    "pinned": "with retry_queue, each worker on a core of its own",
}
#: Each case's reference (no storm, the same healthy worker).
REFERENCE = {"shared": "none", "isolated": "none", "isolated_low": "none", "pinned": "none_pinned"}
#: CPU priority of the ``isolated_low`` case's retry worker.
LOW_PRIORITY = 10


def _case(kind: str, healthy: int, storm: int) -> float:
    from benchmarks import app

    env.purge_broker()
    queue = app.PINNED_QUEUE if kind.endswith("pinned") else app.QUEUE
    stormy = not kind.startswith("none")
    if stormy:
        app.reports().set(app.key("outage"), 1)
        task = getattr(app, f"storm_{kind}")
        for i in range(storm):
            task.apply_async((i,), queue=queue)
        wait_until(
            lambda: env.counter("storm_attempts") >= storm * WARM_ATTEMPTS,
            timeout=600,
            what="the storm to be retrying",
        )
    started = time.perf_counter()
    for i in range(healthy):
        app.healthy.apply_async((i,), queue=queue)
    wait_until(
        lambda: env.counter("healthy") >= healthy, timeout=600, what="healthy tasks", interval=0.01
    )
    elapsed = time.perf_counter() - started
    if stormy:
        # The outage ends: every storm task succeeds once, so cases never overlap.
        app.reports().delete(app.key("outage"))
        wait_until(lambda: env.counter("storm_done") >= storm, timeout=600, what="the storm to end")
    return healthy / elapsed


def run(*, healthy: int, rounds: int, storm: int = STORM) -> list[dict[str, Any]]:
    """Four result rows (without ``retry_queue``, with it, with it and a niced retry
    worker, with it and each worker on a core of its own), as ratios to the no-failure
    throughput of the same healthy worker (``--quick`` uses a smaller storm, as a harness
    check).
    """
    from benchmarks.app import LOW_RETRY_QUEUE, PINNED_QUEUE, PINNED_RETRY_QUEUE, RETRY_QUEUE

    env.reset_outbox()
    worker = start_worker(pool="prefork", concurrency=2)
    retry_worker = start_worker(pool="prefork", concurrency=2, queue=RETRY_QUEUE)
    low_worker = start_worker(
        pool="prefork", concurrency=2, queue=LOW_RETRY_QUEUE, nice=LOW_PRIORITY
    )
    last = str((os.cpu_count() or 1) - 1)
    pinned = start_worker(pool="prefork", concurrency=2, queue=PINNED_QUEUE, cpus="0")
    pinned_retry = start_worker(pool="prefork", concurrency=2, queue=PINNED_RETRY_QUEUE, cpus=last)
    try:
        _case("none", min(healthy, 200), storm)  # warm-up
        _case("none_pinned", min(healthy, 200), storm)
        samples: dict[str, list[float]] = {kind: [] for kind in CASES}
        for _ in range(rounds):
            for kind in CASES:
                samples[kind].append(_case(kind, healthy, storm))
    finally:
        pinned_retry.stop()
        pinned.stop()
        low_worker.stop()
        retry_worker.stop()
        worker.stop()
        env.purge_broker()
        env.reset_outbox()
    rows = []
    for kind in ("shared", "isolated", "isolated_low", "pinned"):
        reference = samples[REFERENCE[kind]]
        ratios = [s / n for s, n in zip(samples[kind], reference, strict=True)]
        rows.append(
            {
                "benchmark": "retry isolation",
                "case": f"{storm} failing, {CASES[kind]}",
                "unit": "healthy tasks/s",
                "tasks": healthy,
                "rounds": rounds,
                "baseline": median(reference),
                "value": median(samples[kind]),
                "ratio": median(ratios),
                "target": None if kind == "shared" else 0.95,
                "samples": {kind: samples[kind], REFERENCE[kind]: reference},
            }
        )
    return rows
