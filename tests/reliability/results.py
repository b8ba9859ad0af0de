"""The measured counts of every reliability scenario, kept in ``results.json``.

Each test records its scenario before it asserts, so a failing run still leaves its
numbers; :mod:`tests.reliability.report` renders the file into ``docs/reliability.md``.
"""

from __future__ import annotations

import fcntl
import json
import os
import tempfile
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

#: Where the tests write their results (override with ``RELIABILITY_RESULTS``).
RESULTS_PATH = Path(os.environ.get("RELIABILITY_RESULTS", Path(__file__).with_name("results.json")))


@dataclass(frozen=True, kw_only=True)
class ScenarioResult:
    """One scenario's measured counts: tasks dispatched, lost, and duplicate executions."""

    scenario: str
    title: str
    tasks: int
    lost: int
    duplicates: int
    notes: str = ""
    extra: dict[str, Any] = field(default_factory=dict)
    measured_at: str = field(
        default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds")
    )


def load(path: Path = RESULTS_PATH) -> dict[str, ScenarioResult]:
    """Every recorded scenario, by id (empty when nothing was recorded yet)."""
    if not path.exists():
        return {}
    raw: dict[str, dict[str, Any]] = json.loads(path.read_text())
    return {key: ScenarioResult(**value) for key, value in raw.items()}


def record(result: ScenarioResult, path: Path = RESULTS_PATH) -> None:
    """Add or replace ``result`` in the file (written atomically, under a lock: the suite
    runs in several processes).
    """
    with path.with_name(f".{path.name}.lock").open("a") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        _record(result, path)


def _record(result: ScenarioResult, path: Path) -> None:
    current = load(path)
    current[result.scenario] = result
    data = {key: asdict(value) for key, value in sorted(current.items())}
    fd, tmp = tempfile.mkstemp(dir=path.parent, prefix=".results-", suffix=".json")
    with os.fdopen(fd, "w") as handle:
        json.dump(data, handle, indent=2, sort_keys=True)
        handle.write("\n")
    os.replace(tmp, path)
