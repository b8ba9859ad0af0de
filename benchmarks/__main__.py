"""``python -m benchmarks``: run every benchmark, print the table, write the JSON.

Needs PostgreSQL and Redis on loopback (``BENCH_POSTGRES_URL``, ``BENCH_REDIS_URL``).
``--quick`` runs tiny sizes (a harness check, not a measurement).
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from pathlib import Path
from typing import Any

#: Every benchmark, in the order they run.
NAMES = (
    "enqueue",
    "sweep",
    "sweep_scale",
    "retry_memory",
    "no_blocking",
    "retry_isolation",
    "latency",
    "atomic",
    "workflows",
    "peer",
    "django_tasks",
    "scrape",
    "observability",
    "admin_pages",
    "async_dispatch",
)
#: ``--quick`` retry memory: shorter settling, fewer RSS samples (its bytes mean nothing).
QUICK_RETRY_MEMORY: dict[str, Any] = {"settle": 0.5, "samples": 2}


def parse(argv: list[str]) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(prog="python -m benchmarks", description=__doc__)
    parser.add_argument("--only", nargs="+", choices=NAMES, default=list(NAMES))
    parser.add_argument("--rounds", type=int, default=3, help="rounds per benchmark (3)")
    parser.add_argument("--enqueue-tasks", type=int, default=3000)
    parser.add_argument("--rows", type=int, default=20_000, help="sweep and peer rows")
    parser.add_argument("--retries", type=int, default=20_000, help="pending long retries")
    parser.add_argument("--healthy", type=int, default=1500, help="healthy tasks per case")
    parser.add_argument("--latency-tasks", type=int, default=1000)
    parser.add_argument("--atomic-tasks", type=int, default=2000, help="atomic: tasks per case")
    parser.add_argument("--chains", type=int, default=200, help="workflows: chains per case")
    parser.add_argument("--warm-up", type=int, default=1000, help="retry memory warm-up tasks")
    parser.add_argument("--failing", type=int, default=20, help="no blocking: failing tasks")
    parser.add_argument("--storm", type=int, default=500, help="retry isolation: failing tasks")
    parser.add_argument(
        "--scrape-rows", type=int, default=1_000_000, help="scrape: outbox rows (1,000,000)"
    )
    parser.add_argument(
        "--broker",
        choices=("redis", "amqp"),
        default="redis",
        help="the broker: Redis (default) or RabbitMQ (rows marked [RabbitMQ])",
    )
    parser.add_argument(
        "--parked-rows", type=int, default=1_000_000, help="empty sweep: parked rows (1,000,000)"
    )
    parser.add_argument(
        "--admin-rows", type=int, default=1_000_000, help="admin pages: outbox rows (1,000,000)"
    )
    parser.add_argument(
        "--admin-letters", type=int, default=100_000, help="admin pages: dead letters (100,000)"
    )
    parser.add_argument(
        "--admin-completed",
        type=int,
        default=1_000_000,
        help="admin pages: completed atomic tasks (1,000,000)",
    )
    parser.add_argument(
        "--admin-workflows",
        type=int,
        default=1_000_000,
        help="admin pages: workflows (1,000,000)",
    )
    parser.add_argument("--quick", action="store_true", help="tiny sizes, one round")
    parser.add_argument("--json", type=Path, default=None, help="output (results/latest.json)")
    args = parser.parse_args(argv)
    if args.quick:
        args.rounds, args.enqueue_tasks, args.rows = 1, 100, 300
        args.retries, args.healthy, args.latency_tasks = 100, 100, 30
        args.warm_up, args.failing, args.atomic_tasks = 100, 2, 50
        args.chains, args.scrape_rows, args.storm = 10, 3000, 20
        args.parked_rows = 3000
        args.admin_rows, args.admin_letters, args.admin_completed = 3000, 300, 3000
        args.admin_workflows = 150
    return args


def run(name: str, args: argparse.Namespace) -> list[dict[str, Any]]:
    """Run one benchmark; its result rows."""
    from benchmarks import (
        admin_pages,
        async_dispatch,
        atomic,
        django_tasks,
        enqueue,
        latency,
        no_blocking,
        observability,
        peer,
        retry_isolation,
        retry_memory,
        scrape,
        sweep,
        sweep_scale,
        workflows,
    )

    if name == "enqueue":
        return enqueue.run(tasks=args.enqueue_tasks, rounds=args.rounds)
    if name == "sweep":
        return sweep.run(rows=args.rows, rounds=args.rounds)
    if name == "sweep_scale":
        return sweep_scale.run(rows=args.rows, parked=args.parked_rows)
    if name == "retry_memory":
        quick = QUICK_RETRY_MEMORY if args.quick else {}
        return retry_memory.run(retries=args.retries, warm_up=args.warm_up, **quick)
    if name == "no_blocking":
        return no_blocking.run(healthy=args.healthy, rounds=args.rounds, failing=args.failing)
    if name == "retry_isolation":
        return retry_isolation.run(healthy=args.healthy, rounds=args.rounds, storm=args.storm)
    if name == "latency":
        return latency.run(tasks=args.latency_tasks)
    if name == "atomic":
        return atomic.run(tasks=args.atomic_tasks, rounds=args.rounds, quick=args.quick)
    if name == "django_tasks":
        return django_tasks.run(tasks=args.enqueue_tasks, rounds=args.rounds)
    if name == "workflows":
        return workflows.run(chains=args.chains, rounds=args.rounds, quick=args.quick)
    if name == "observability":
        return observability.run(
            tasks=args.enqueue_tasks, worker_tasks=args.healthy, rounds=args.rounds
        )
    if name == "scrape":
        return scrape.run(rows=args.scrape_rows, rounds=args.rounds)
    if name == "admin_pages":
        return admin_pages.run(
            rows=args.admin_rows,
            letters=args.admin_letters,
            completed=args.admin_completed,
            workflows=args.admin_workflows,
            rounds=args.rounds,
        )
    if name == "async_dispatch":
        return async_dispatch.run(tasks=args.enqueue_tasks // 3, rounds=args.rounds)
    return peer.run(rows=args.rows, rounds=max(1, min(args.rounds, 2)))


def main(argv: list[str]) -> int:
    """Run the chosen benchmarks; 0 when every one ran, 1 when one failed."""
    args = parse(argv)
    os.environ.setdefault("BENCH_QUEUE", f"celery-outbox-bench-{os.getpid()}")
    if args.broker == "amqp":  # before the app is imported, and for the workers it starts
        amqp = os.environ.get("BENCH_AMQP_URL", "amqp://guest:guest@127.0.0.1:5672//")
        os.environ["BENCH_BROKER_URL"] = amqp
    from benchmarks import env, report

    env.setup_django()
    rows: list[dict[str, Any]] = []
    failed = False
    try:
        for name in args.only:
            started = time.monotonic()
            print(f"-- {name} ...", flush=True)
            try:
                found = run(name, args)
                if args.broker == "amqp":
                    found = [{**row, "case": f"{row['case']} [RabbitMQ]"} for row in found]
                rows.extend(found)
            except Exception as exc:  # report it, run the others
                failed = True
                traceback.print_exc()
                label = name.replace("_", " ")
                rows.append({"benchmark": label, "case": "error", "skipped": repr(exc)})
            print(f"   done in {time.monotonic() - started:.0f} s", flush=True)
    finally:
        env.purge_broker()
    print()
    print(report.table(rows))
    path = args.json or report.LATEST
    settings = {key: value for key, value in vars(args).items() if key != "json"}
    report.write_json(rows, {**settings, "argv": argv}, path)
    print(f"\nwritten to {path}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
