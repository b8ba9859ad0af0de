"""The closest peer, django-celery-outbox: its relay vs our sweep on the same N rows.

It is installed in a virtualenv of its own (``BENCH_PEER_VENV``, default under /tmp),
never in the project's: that venv sees the benchmark environment's packages through a
``.pth`` file and adds django-celery-outbox and its own dependencies (structlog,
sentry-sdk, datadog). Its rows live in a database of their own. Each round runs our sweep
(``benchmarks.sweep``) and its relay on the same tasks and arguments, at its default batch
size (100) and at ours (500).
"""

from __future__ import annotations

import json
import os
import site
import subprocess
import sys
from pathlib import Path
from typing import Any

from benchmarks import env, sweep
from benchmarks.processes import ROOT
from benchmarks.stats import median, ratio

#: The version measured (pinned so that runs compare).
PEER = "django-celery-outbox==0.4.3"
VENV = Path(os.environ.get("BENCH_PEER_VENV", "/tmp/celery-outbox-bench-peer-venv"))
#: Its relay's default batch size (``celery_outbox_relay --batch-size``), and ours.
BATCH_SIZES = (100, 500)


class PeerUnavailable(RuntimeError):
    """django-celery-outbox could not be installed or run; the message says why."""


def ensure_venv() -> Path:
    """The peer venv's python, creating the venv and installing the peer when needed."""
    python = VENV / "bin" / "python"
    if python.exists() and _has_peer(python):
        return python
    _run([sys.executable, "-m", "venv", str(VENV)], "create the peer venv")
    purelib = Path(
        _run(
            [str(python), "-c", "import sysconfig;print(sysconfig.get_paths()['purelib'])"],
            "find its site-packages",
        )
    )
    (purelib / "benchmark-env.pth").write_text("\n".join(site.getsitepackages()) + "\n")
    _run([str(python), "-m", "pip", "install", "-q", PEER], f"pip install {PEER}")
    return python


def _has_peer(python: Path) -> bool:
    return (
        subprocess.run(
            [str(python), "-c", "import django_celery_outbox"], capture_output=True, check=False
        ).returncode
        == 0
    )


def _run(argv: list[str], what: str) -> str:
    done = subprocess.run(
        argv,
        capture_output=True,
        text=True,
        check=False,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    if done.returncode != 0:
        raise PeerUnavailable(f"could not {what}: {(done.stderr or done.stdout)[-800:]}")
    return done.stdout.strip()


def peer_round(python: Path, rows: int, batch_size: int) -> float:
    """Its relay's rows/s on ``rows`` rows (a subprocess in its venv)."""
    from benchmarks.settings import PEER_DATABASE, POSTGRES_URL

    env.create_database(POSTGRES_URL.rsplit("/", 1)[0] + f"/{PEER_DATABASE}")
    env.purge_broker()
    out = _run(
        [str(python), "-m", "benchmarks.peer_relay", str(rows), str(batch_size)],
        "run django-celery-outbox's relay",
    )
    if env.queue_length() != rows:
        raise RuntimeError(f"its relay left {env.queue_length()} of {rows} messages queued")
    env.purge_broker()
    result = json.loads(out.rsplit("RESULT ", 1)[1])
    return float(result["rows_per_s"])


def run(*, rows: int, rounds: int) -> list[dict[str, Any]]:
    """One result row per peer batch size: our sweep vs its relay, medians of rounds."""
    try:
        python = ensure_venv()
    except PeerUnavailable as exc:
        return [{"benchmark": "peer", "case": "django-celery-outbox", "skipped": str(exc)}]
    ours: list[float] = []
    theirs: dict[int, list[float]] = {size: [] for size in BATCH_SIZES}
    for _ in range(rounds):
        ours.append(sweep.sweep_round(rows))
        for size in BATCH_SIZES:
            theirs[size].append(peer_round(python, rows, size))
    env.reset_outbox()
    analysed = sweep.table_analysed()
    state = ", our table analysed before" if analysed else ""
    return [
        {
            "benchmark": "peer",
            "case": f"{rows} rows, its batch {size}{state}",
            "table_analysed": analysed,
            "unit": "rows/s",
            "tasks": rows,
            "rounds": rounds,
            "peer": median(theirs[size]),
            "ours": median(ours),
            "ratio": ratio(median(ours), median(theirs[size])),
            "target": 1.0,
            "samples": {"peer": theirs[size], "ours": ours},
        }
        for size in BATCH_SIZES
    ]
