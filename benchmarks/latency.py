"""Commit -> task start latency, on the on-commit path and on the sweep path.

A prefork worker (concurrency 2) consumes; tasks record ``time.time()`` when they start.
Each task is dispatched in its own transaction; the commit time is taken by an
``on_commit`` callback registered before the dispatch (so it runs right after COMMIT,
before the outbox publishes). Dispatches are ``GAP`` seconds apart, so the latency is the
path's, not a queue's.

- ``plain``: ``apply_async`` outside the outbox (time of the call -> start), the reference;
- ``on-commit``: ``OutboxTask.delay()`` in the transaction, published after COMMIT;
- ``sweep``: the row is committed without its on-commit publish (as if the process died
  right after COMMIT, or with ``outbox_publish_grace = 0``) and
  ``django-admin outbox relay --grace 0 --poll 0.2`` publishes it: once polling only
  (``--no-listen``), once woken by the outbox trigger's ``NOTIFY`` (PostgreSQL). Two more
  rows time the sweep path to the broker only (commit -> the message in the Redis queue,
  no worker): the relay's own part, without the worker's.
  The beat-driven sweep adds ``outbox_publish_grace`` (10 s) plus up to
  ``outbox_sweep_interval`` (5 s) to this by design.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from benchmarks import env
from benchmarks.processes import start_relay, start_worker, wait_until
from benchmarks.stats import percentile

#: Seconds between two dispatches.
GAP = 0.01
#: The relay loop's pause between idle passes (``outbox relay``'s default).
RELAY_POLL = 0.2
#: p50 of the sweep path woken by NOTIFY (issue 20: p50 <= 20 ms, p99 <= 100 ms).
NOTIFY_TARGET = 20.0


def _starts() -> dict[str, float]:
    from benchmarks.app import key, reports

    lines: list[bytes] = reports().lrange(key("starts"), 0, -1)  # type: ignore[assignment]
    entries = (line.decode().split() for line in lines)
    return {task_id: float(at) for task_id, at in entries}


def _plain(i: int) -> tuple[str, float]:
    from benchmarks.app import plain_started

    at = time.time()
    return plain_started.apply_async((i,)).id, at


def _committed(dispatch: Callable[[int], str]) -> Callable[[int], tuple[str, float]]:
    def run(i: int) -> tuple[str, float]:
        from django.db import transaction

        committed: list[float] = []
        with transaction.atomic():
            transaction.on_commit(lambda: committed.append(time.time()))
            task_id = dispatch(i)
        return task_id, committed[0]

    return run


def _on_commit(i: int) -> str:
    from benchmarks.app import outbox_started

    return str(outbox_started.delay(i).id)


def _unpublished(i: int) -> str:
    from benchmarks.app import outbox_started
    from benchmarks.seeding import outbox_messages
    from celery_outbox.registry import store_for

    message = outbox_messages(outbox_started, 1)[0]
    store_for(outbox_started.app).add(message)  # no on-commit publish: the sweeper's job
    return str(message.task_id)


def _measure(path: Callable[[int], tuple[str, float]], tasks: int) -> list[float]:
    env.purge_broker()
    sent = {}
    for i in range(tasks):
        task_id, at = path(i)
        sent[task_id] = at
        time.sleep(GAP)
    wait_until(lambda: len(_starts()) >= tasks, timeout=120, what=f"{tasks} task starts")
    starts = _starts()
    return [(starts[task_id] - at) * 1000 for task_id, at in sent.items()]


def _row(case: str, latencies: list[float], target: float | None) -> dict[str, Any]:
    return {
        "benchmark": "latency",
        "case": case,
        "unit": "ms",
        "tasks": len(latencies),
        "rounds": 1,
        "p50": percentile(latencies, 0.5),
        "p99": percentile(latencies, 0.99),
        "target": target,
    }


def run(*, tasks: int) -> list[dict[str, Any]]:
    """Six result rows (p50/p99 in ms): plain, on-commit and sweep paths to the task's start,
    the sweep path polled and woken by NOTIFY; then the sweep path to the broker alone.
    """
    env.reset_outbox()
    worker = start_worker(pool="prefork", concurrency=2)
    try:
        _measure(_committed(_on_commit), min(tasks, 50))  # warm-up
        rows = [
            _row("plain apply_async", _measure(_plain, tasks), None),
            _row("on-commit path", _measure(_committed(_on_commit), tasks), 10.0),
        ]
        for listen, case, target in (
            (False, f"sweep path (relay, poll {RELAY_POLL} s)", None),
            (True, f"sweep path (relay, NOTIFY, poll {RELAY_POLL} s)", NOTIFY_TARGET),
        ):
            relay = start_relay(poll=RELAY_POLL, grace=0.0, listen=listen)
            try:
                rows.append(_row(case, _measure(_committed(_unpublished), tasks), target))
            finally:
                relay.stop()
    finally:
        worker.stop()
        env.purge_broker()
    if env.on_rabbitmq():  # the relay's part alone is read from the Redis list (BLPOP)
        return rows
    try:
        for listen, case in ((False, "poll"), (True, "NOTIFY")):
            relay = start_relay(poll=RELAY_POLL, grace=0.0, listen=listen)
            try:
                latencies = _to_broker(tasks)
            finally:
                relay.stop()
            rows.append(
                _row(f"sweep path, commit -> in the broker (relay, {case})", latencies, None)
            )
    finally:
        env.purge_broker()
        env.reset_outbox()
    return rows


def _to_broker(tasks: int) -> list[float]:
    """Commit -> the message in the Redis queue (no worker: the relay's part alone), one
    row at a time (``BLPOP`` waits for each).
    """
    from benchmarks.app import QUEUE, reports

    client, latencies = reports(), []
    for i in range(tasks):
        _, committed = _committed(_unpublished)(i)
        if client.blpop([QUEUE], timeout=30) is None:
            raise RuntimeError("the relay published nothing in 30 s")
        latencies.append((time.time() - committed) * 1000)
        time.sleep(GAP)
    return latencies
