"""The README's first command: the demo runs without any server, and its numbers are true.

Every Python process the demo starts (itself, the worker, beat) loads
``no_network/sitecustomize.py``, which refuses and logs any TCP/UDP connection; the
PostgreSQL, Redis and RabbitMQ URLs of the environment point at closed ports too. The
demo must still reach its summary, exit 0, and print numbers that a direct look at the
SQLite database it leaves confirms.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import socket
import sqlite3
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

django = pytest.importorskip("django", reason="the demo needs Django (the dev extra)")
if django.VERSION < (5, 1):
    pytest.skip(
        "the demo's SQLite setup needs Django 5.1+ (transaction_mode)", allow_module_level=True
    )

ROOT = Path(__file__).resolve().parents[2]
NO_NETWORK = Path(__file__).resolve().parent / "no_network"
#: The acceptance bound of the README's first command (seconds to the summary).
SUMMARY_WITHIN = 120.0

pytestmark = [pytest.mark.slow, pytest.mark.timeout(400)]


def closed_ports(count: int) -> list[int]:
    """Ports nothing listens on: bound, then closed, by this process."""
    sockets = [socket.socket(socket.AF_INET, socket.SOCK_STREAM) for _ in range(count)]
    try:
        for sock in sockets:
            sock.bind(("127.0.0.1", 0))
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def offline_environment(var_dir: Path, connect_log: Path) -> dict[str, str]:
    """The test's environment without any service setting, then every URL on a closed port."""
    env = {
        key: value
        for key, value in os.environ.items()
        if not key.startswith(("CELERY_", "SHOP_", "DJANGO_", "OUTBOX_"))
        and key not in ("DATABASE_URL", "PYTHONPATH")
    }
    pg, redis, amqp, mysql = closed_ports(4)
    urls = {
        "postgres": f"postgresql://outbox:outbox@127.0.0.1:{pg}/outbox",
        "redis": f"redis://127.0.0.1:{redis}/0",
        "amqp": f"amqp://guest:guest@127.0.0.1:{amqp}//",
        "mysql": f"mysql://outbox:outbox@127.0.0.1:{mysql}/outbox",
    }
    env.update(
        {
            "OUTBOX_TEST_POSTGRES_URL": urls["postgres"],
            "OUTBOX_TEST_REDIS_URL": urls["redis"],
            "OUTBOX_TEST_AMQP_URL": urls["amqp"],
            "OUTBOX_TEST_MYSQL_URL": urls["mysql"],
            # What the shop's settings read: the demo must ignore them (no --use-env).
            "DATABASE_URL": urls["postgres"],
            "CELERY_BROKER_URL": urls["redis"],
            "CELERY_RESULT_BACKEND": urls["redis"],
            "REDIS_URL": urls["redis"],
            "AMQP_URL": urls["amqp"],
            "SHOP_VAR_DIR": str(var_dir),
            "PYTHONPATH": str(NO_NETWORK),
            "OUTBOX_DEMO_CONNECT_LOG": str(connect_log),
            "PYTHONUNBUFFERED": "1",
        }
    )
    return env


def readme_demo_command() -> list[str]:
    """The python part of the README's first command, with this interpreter."""
    readme = (ROOT / "README.md").read_text()
    block = re.search(r"```bash\n(.*?)\n```", readme, re.S)
    assert block is not None, "README.md has no bash block"
    parts = [part.strip() for part in block.group(1).split("&&")]
    demo = [part for part in parts if "example_project/demo.py" in part]
    assert demo, f"the README's first command does not run the demo: {block.group(1)!r}"
    words = shlex.split(demo[0])
    assert words[0] in ("python", "python3"), words
    return [sys.executable, *words[1:]]


@dataclass(frozen=True)
class DemoRun:
    """One finished demo process."""

    returncode: int
    output: str
    seconds: float
    var_dir: Path
    connect_log: Path


def run_demo(command: list[str], tmp: Path) -> DemoRun:
    """Run ``command`` (from the repository root) offline; never longer than 300 s."""
    var_dir, log = tmp / "var", tmp / "connections.log"
    began = time.monotonic()
    done = subprocess.run(
        command,
        cwd=ROOT,
        env=offline_environment(var_dir, log),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        timeout=300,
        check=False,
    )
    return DemoRun(done.returncode, done.stdout, time.monotonic() - began, var_dir, log)


def assert_offline(run: DemoRun) -> None:
    """No process of the run tried a network connection."""
    attempts = run.connect_log.read_text() if run.connect_log.exists() else ""
    assert attempts == "", f"the demo tried to reach a server:\n{attempts}"


@pytest.fixture(scope="module")
def demo_runs(tmp_path_factory: pytest.TempPathFactory) -> tuple[DemoRun, DemoRun, Path]:
    """The README's command and ``demo.py --short --json``, each run once, side by side.

    The two runs share nothing (each has its own SQLite file, broker folder and worker)
    and mostly wait on the demo's outages and back-offs, so running them at the same time
    costs the time of the longer one. Gives both runs and the short run's JSON path.
    """
    readme_tmp, short_tmp = (
        tmp_path_factory.mktemp("readme-demo"),
        tmp_path_factory.mktemp("short-demo"),
    )
    summary_path = short_tmp / "summary.json"
    short = [sys.executable, "example_project/demo.py", "--short", "--json", str(summary_path)]
    with ThreadPoolExecutor(max_workers=2) as pool:
        readme = pool.submit(run_demo, readme_demo_command(), readme_tmp)
        short_run = pool.submit(run_demo, short, short_tmp)
        return readme.result(), short_run.result(), summary_path


@pytest.fixture(scope="module")
def readme_run(demo_runs: tuple[DemoRun, DemoRun, Path]) -> DemoRun:
    """The README's first command (its python part), run once."""
    return demo_runs[0]


@pytest.fixture(scope="module")
def short_run(demo_runs: tuple[DemoRun, DemoRun, Path]) -> tuple[DemoRun, dict[str, Any]]:
    """``demo.py --short --json``, run once; yields the run and its JSON summary."""
    _, run, summary_path = demo_runs
    assert run.returncode == 0, run.output
    return run, json.loads(summary_path.read_text())


def test_readme_command_reaches_its_summary_offline_in_time(readme_run: DemoRun) -> None:
    assert readme_run.returncode == 0, readme_run.output
    assert "Summary, counted from the database (every order settled" in readme_run.output
    assert "admin/django_outbox/deadletter/" in readme_run.output
    assert "user admin, password admin" in readme_run.output
    assert readme_run.seconds < SUMMARY_WITHIN, readme_run.output
    assert_offline(readme_run)


def test_readme_command_leaves_no_worker_behind(readme_run: DemoRun) -> None:
    worker_log = (readme_run.var_dir / "worker.log").read_text()
    assert "Connected to shop_project.broker:Transport" in worker_log
    assert "beat: Shutting down" in worker_log or "Warm shutdown" in worker_log
    stopped = re.search(r"Stopped the worker \(pid (\d+)\)", readme_run.output)
    assert stopped is not None, readme_run.output
    with pytest.raises(ProcessLookupError):  # the demo stopped (and reaped) its worker
        os.kill(int(stopped.group(1)), 0)


def test_short_demo_is_offline(short_run: tuple[DemoRun, dict[str, Any]]) -> None:
    run, summary = short_run
    assert_offline(run)
    assert summary["settled"] is True
    assert summary["database"] == str(run.var_dir / "shop.sqlite3")


# --- the numbers, counted again straight from the SQLite file --------------------------------


def query(db: Path, sql: str, *params: Any) -> list[tuple[Any, ...]]:
    """Rows of ``sql`` against the demo's database (read-only)."""
    with sqlite3.connect(f"file:{db}?mode=ro", uri=True) as conn:
        return conn.execute(sql, params).fetchall()


NOTES = (
    "SELECT n.id, n.order_id, n.channel, n.status, n.attempts, n.task_id "
    "FROM shop_notification n JOIN shop_order o ON o.id = n.order_id WHERE o.batch = ?"
)


@pytest.fixture(scope="module")
def database(short_run: tuple[DemoRun, dict[str, Any]]) -> tuple[Path, dict[str, Any]]:
    """The SQLite file the short demo left, and its JSON summary."""
    run, summary = short_run
    return run.var_dir / "shop.sqlite3", summary


def test_orders_and_deliveries_match(database: tuple[Path, dict[str, Any]]) -> None:
    db, summary = database
    batch = summary["batch"]
    [(orders,)] = query(db, "SELECT count(*) FROM shop_order WHERE batch = ?", batch)
    assert orders == summary["orders"] == 12
    notes = query(db, NOTES, batch)
    delivered: dict[str, int] = {"push": 0, "sms": 0, "messenger": 0}
    for _, _, channel, status, _, _ in notes:
        delivered[channel] += status == "delivered"
    assert delivered == summary["delivered"]
    undeliverable = sum(1 for n in notes if n[2] == "messenger" and n[3] == "dead")
    assert undeliverable == summary["undeliverable"]
    assert sum(delivered.values()) + undeliverable == orders
    assert len(notes) == summary["notifications"]


def test_every_order_settled_once(database: tuple[Path, dict[str, Any]]) -> None:
    db, summary = database
    by_order: dict[int, dict[str, str]] = {}
    for _, order, channel, status, _, _ in query(db, NOTES, summary["batch"]):
        by_order.setdefault(order, {})[channel] = status
    for order, channels in by_order.items():
        statuses = list(channels.values())
        assert "queued" not in statuses, (order, channels)
        assert statuses.count("delivered") == 1 or statuses == ["dead"] * 3, (order, channels)
        # Fail-over order: a channel is only tried after the one before it is dead.
        tried = [c for c in ("push", "sms", "messenger") if c in channels]
        assert tried == ["push", "sms", "messenger"][: len(tried)], (order, channels)
        assert all(channels[c] == "dead" for c in tried[:-1]), (order, channels)


def test_dead_letters_match(database: tuple[Path, dict[str, Any]]) -> None:
    db, summary = database
    notes = query(db, NOTES, summary["batch"])
    dead = {task_id: attempts for _, _, _, status, attempts, task_id in notes if status == "dead"}
    letters = query(
        db, "SELECT task_id, exception_type, retries, status FROM celery_outbox_deadletter"
    )
    ours = [letter for letter in letters if letter[0] in {n[5] for n in notes}]
    assert len(ours) == summary["dead_letters"] == len(dead)
    kinds: dict[str, int] = {}
    for task_id, exception_type, retries, status in ours:
        name = exception_type.rsplit(".", 1)[-1]
        kinds[name] = kinds.get(name, 0) + 1
        assert status == "dead"
        assert retries == dead[task_id] - 1  # the dead letter records the retries it had
        if name in ("InvalidPhoneNumber", "DeviceNotRegistered"):
            assert retries == 0  # a permanent error is never retried
        else:
            # A transient error (a failed send, an outage) after every retry was used.
            assert name in ("ProviderError", "ProviderOutage")
            assert retries == 4  # SHOP_MAX_RETRIES
    assert kinds == summary["dead_letters_by_exception"]
    assert kinds.get("DeviceNotRegistered", 0) > 0
    assert kinds.get("InvalidPhoneNumber", 0) > 0


def test_retries_and_parking_match(database: tuple[Path, dict[str, Any]]) -> None:
    db, summary = database
    notes = query(db, NOTES, summary["batch"])
    runs = [n[4] for n in notes if n[4] > 0]
    assert sum(runs) == summary["attempts"]
    assert sum(runs) - len(runs) == summary["retries"]
    task_ids = {n[5] for n in notes}
    rows = [
        row
        for row in query(
            db,
            "SELECT task_id, status, json_extract(options, '$.headers.retries'), "
            "created_at, published_at FROM celery_outbox_message",
        )
        if row[0] in task_ids
    ]
    parked = [row for row in rows if (row[2] or 0) >= 1]
    assert len(parked) == summary["parked_retries"] > 0
    assert summary["eta_retries"] == summary["retries"] - len(parked) > 0
    assert all(row[1] == "published" for row in rows), "a row was left unpublished"
    dispatched = [row for row in rows if (row[2] or 0) == 0]
    assert len(dispatched) == len(notes) == summary["publish_latency_ms"]["count"]
    latency = summary["publish_latency_ms"]
    assert 0 < latency["p50"] <= latency["p99"] <= latency["max"]
    assert summary["parked_lag_ms"]["count"] == len(parked)


WORKFLOWS = (
    "SELECT o.id, o.reservations, w.status, w.steps_total, w.steps_done, w.root_id "
    "FROM shop_order o LEFT JOIN outbox_workflow w ON w.root_id = o.fulfilment_id "
    "WHERE o.batch = ?"
)


def test_every_fulfilment_workflow_succeeded_each_step_once(
    database: tuple[Path, dict[str, Any]],
) -> None:
    db, summary = database
    batch = summary["batch"]
    items: dict[int, list[tuple[int, int]]] = {}
    for order, item, packings in query(
        db,
        "SELECT i.order_id, i.id, i.packings FROM shop_orderitem i "
        "JOIN shop_order o ON o.id = i.order_id WHERE o.batch = ? ORDER BY i.id",
        batch,
    ):
        items.setdefault(order, []).append((item, packings))
    shipments: dict[int, list[tuple[list[int], int]]] = {}
    for order, packed, retries in query(
        db,
        "SELECT s.order_id, s.packed_items, s.retries FROM shop_shipment s "
        "JOIN shop_order o ON o.id = s.order_id WHERE o.batch = ?",
        batch,
    ):
        shipments.setdefault(order, []).append((json.loads(packed), retries))
    steps = dict(
        query(db, "SELECT root_id, count(*) FROM celery_outbox_completedtask GROUP BY root_id")
    )
    workflows = query(db, WORKFLOWS, batch)
    assert len(workflows) == 12
    # The only workflows are the fulfilments: a fail-over's notification is none.
    assert query(db, "SELECT count(*) FROM outbox_workflow") == [(12,)]
    for order, reservations, status, total, done, root in workflows:
        lines = items[order]
        assert 1 <= len(lines) <= 4, (order, lines)
        assert status == "succeeded", (order, status)
        # reserve_stock, one pack_item per item, ship: each committed exactly once.
        assert total == done == steps[root] == len(lines) + 2, (order, total, done, steps[root])
        assert reservations == 1, order
        assert all(packings == 1 for _, packings in lines), (order, lines)
        # One shipment, holding the pack results in the chord header's order.
        assert [packed for packed, _ in shipments[order]] == [[i for i, _ in lines]], order
    fulfilment = summary["fulfilment"]
    assert fulfilment["workflows"] == {"succeeded": 12, "running": 0, "failed": 0}
    assert fulfilment["exactly_once"] is True
    assert fulfilment["duplicates"] == 0
    assert fulfilment["items"] == fulfilment["packed_once"] == sum(map(len, items.values()))
    assert fulfilment["reserved_once"] == fulfilment["shipped_once"] == 12
    # The carrier's outage made the ship steps retry, and the workflows outlasted it.
    retries = sum(r for order_shipments in shipments.values() for _, r in order_shipments)
    assert fulfilment["ship_retries"] == retries > 0


def test_summary_printed_is_the_json(short_run: tuple[DemoRun, dict[str, Any]]) -> None:
    run, summary = short_run
    for label, value in (
        ("orders", summary["orders"]),
        ("retries", summary["retries"]),
        ("dead letters", summary["dead_letters"]),
        ("delivered by SMS", summary["delivered"]["sms"]),
    ):
        assert re.search(rf"^  {re.escape(label)}\s+{value}\b", run.output, re.M), label
    assert f"p50 {summary['publish_latency_ms']['p50']} ms" in run.output
    fulfilment = summary["fulfilment"]
    for label, value in (
        ("succeeded", fulfilment["workflows"]["succeeded"]),
        ("failed", fulfilment["workflows"]["failed"]),
        ("shipped once", fulfilment["shipped_once"]),
        ("carrier retries", fulfilment["ship_retries"]),
    ):
        assert re.search(rf"^  {re.escape(label)}\s+{value}\b", run.output, re.M), label
    assert "every step took effect exactly once" in run.output
