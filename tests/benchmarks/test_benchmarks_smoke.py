"""Each benchmark runs end to end at a tiny size: the harness works (no timing assertions).

Every case runs ``python -m benchmarks --quick --only NAME`` in a subprocess (the harness
configures Django itself) against the test PostgreSQL server and Redis.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit, urlunsplit

import pytest

from benchmarks.__main__ import NAMES
from tests.worker import REPO_ROOT

pytestmark = pytest.mark.slow

#: Numeric fields each benchmark's result rows carry.
FIELDS = {
    "enqueue": ("plain", "ours", "ratio"),
    "sweep": ("plain", "ours", "ratio"),
    "sweep_scale": ("ours",),  # rows/s per number of sweepers; the empty sweep's p50 in ms
    "retry_memory": ("plain", "ours", "ratio", "db_bytes_per_row"),
    "no_blocking": ("baseline", "value", "ratio"),
    "retry_isolation": ("baseline", "value", "ratio"),
    "latency": ("p50", "p99"),
    "atomic": ("plain", "ours", "ratio", "completed_bytes_per_row"),
    "workflows": ("plain", "ours", "ratio", "plain_seconds", "ours_seconds", "ours_p95_ms"),
    "peer": ("peer", "ours", "ratio"),
    "django_tasks": ("plain", "ours", "ratio"),
    "scrape": ("p50", "p99"),
    "admin_pages": ("p50", "p99"),
    "observability": ("plain", "ours", "ratio"),
    "async_dispatch": ("plain", "ours", "ratio"),
}
#: Rows of another kind within a benchmark, by (benchmark, unit).
FIELDS_BY_UNIT = {
    ("retry_memory", "MiB"): ("worker_mib", "sweeper_peak_mib", "value"),
    ("async_dispatch", "ms"): (
        "plain_tick_ms",
        "ours_tick_ms",
        "plain_slowest_ms",
        "ours_slowest_ms",
    ),
}
#: Benchmarks that may report why they could not run here, and whether they may now.
MAY_SKIP = {
    "peer": True,  # django-celery-outbox may not install on this machine
    "django_tasks": importlib.util.find_spec("django.tasks") is None,  # Django < 6.0
}


def _with_path(url: str, path: str) -> str:
    return urlunsplit(urlsplit(url)._replace(path=path))


def _run(name: str, postgres_url: str, redis_url: str, output: Path) -> dict[str, Any]:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "BENCH_POSTGRES_URL": _with_path(postgres_url, "/celery_outbox_bench_smoke"),
        "BENCH_PEER_DB": "celery_outbox_bench_smoke_peer",
        "BENCH_REDIS_URL": _with_path(redis_url, "/11"),
        "BENCH_QUEUE": f"celery-outbox-bench-smoke-{os.urandom(4).hex()}",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    argv = [sys.executable, "-m", "benchmarks", "--quick", "--only", name, "--json", str(output)]
    done = subprocess.run(
        argv, cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=600, check=False
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "benchmark" in done.stdout  # the table was printed
    document: dict[str, Any] = json.loads(output.read_text())
    return document


@pytest.mark.parametrize("name", NAMES)
def test_benchmark_runs_at_a_tiny_size(
    name: str, postgres_url: str, redis_url: str, tmp_path: Path
) -> None:
    document = _run(name, postgres_url, redis_url, tmp_path / "results.json")

    rows = document["results"]
    assert rows
    assert {row["benchmark"] for row in rows} == {name.replace("_", " ")}
    for row in rows:
        if "skipped" in row:  # it cannot run here (MAY_SKIP): the reason is given
            assert MAY_SKIP.get(name) or _optional_peer_missing(row), row
            assert row["skipped"]
            continue
        for field in FIELDS_BY_UNIT.get((name, row["unit"]), FIELDS[name]):
            assert isinstance(row[field], (int, float)), (field, row)


def test_payload_memory_runs_at_a_tiny_size(
    postgres_url: str, redis_url: str, tmp_path: Path
) -> None:
    env = {
        **os.environ,
        "PYTHONPATH": str(REPO_ROOT),
        "BENCH_POSTGRES_URL": _with_path(postgres_url, "/celery_outbox_bench_smoke"),
        "BENCH_REDIS_URL": _with_path(redis_url, "/11"),
        "BENCH_QUEUE": f"celery-outbox-bench-smoke-{os.urandom(4).hex()}",
    }
    env.pop("DJANGO_SETTINGS_MODULE", None)
    output = tmp_path / "payload.json"
    argv = [sys.executable, "-m", "benchmarks.payload_memory", "--rows", "3", "--size", "1000"]
    done = subprocess.run(
        [*argv, "--json", str(output)],
        cwd=REPO_ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    rows = json.loads(output.read_text())
    assert [row["case"].split(":")[0] for row in rows] == ["sweep", "transaction"]
    for row in rows:
        for field in ("unbounded", "bounded", "heap_unbounded", "heap_bounded"):
            assert isinstance(row[field], (int, float)), (field, row)


def _optional_peer_missing(row: dict[str, Any]) -> bool:
    """The django_tasks benchmark's comparison row with django-tasks-db, not installed."""
    return row.get("case") == "vs django-tasks-db" and not importlib.util.find_spec(
        "django_tasks_db"
    )
