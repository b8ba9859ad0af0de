"""Worker entry point: ``celery -A benchmarks.worker_app worker`` (Django set up first)."""

from __future__ import annotations

import os
from typing import Any

import django
from celery.signals import worker_ready

os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.settings"
django.setup()

from benchmarks.app import app  # noqa: E402  (Django must be set up first)
from benchmarks.processes import READY  # noqa: E402

if os.environ.get("BENCH_OBSERVE") == "1":  # benchmarks.observability's "on" worker
    import celery_outbox.metrics  # noqa: F401  (connects the counters)
    from benchmarks.observability import install_tracing

    install_tracing()

__all__ = ["app"]


@worker_ready.connect
def _announce(**_: Any) -> None:
    print(READY, flush=True)
