"""The results table (printed) and its JSON file."""

from __future__ import annotations

import json
import platform
from collections.abc import Sequence
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

#: Where ``python -m benchmarks`` writes its results.
LATEST = Path(__file__).resolve().parent / "results" / "latest.json"


def _num(value: float | None, digits: int = 0) -> str:
    if value is None:
        return "-"
    return f"{value:,.{digits}f}"


def _line(row: dict[str, Any]) -> tuple[str, ...]:
    name, case = row["benchmark"], row["case"]
    if "skipped" in row:
        return (name, case, "skipped", "", "", "", row["skipped"][:60])
    target = row.get("target")
    if name == "sweep scale" and "cpu_share" in row:
        cpu = f"sweepers' CPU {row['cpu_share']:.2f} of {row['cores']} cores"
        return (name, case, "", f"{_num(row['ours'])} rows/s", cpu, "", "")
    if name in ("latency", "scrape", "sweep scale", "admin pages"):
        # the scrape's and the pages' bounds hold for (nearly) every one: judged on the p99
        on_p99 = name in ("scrape", "admin pages")
        judged = row["p99"] if on_p99 else row["p50"]
        met = "" if target is None else ("yes" if judged <= target else "NO")
        return (
            name,
            case,
            f"p50 {_num(row['p50'], 1)} ms",
            f"p99 {_num(row['p99'], 1)} ms",
            "",
            f"{'p99' if on_p99 else 'p50'} <= {_num(target)} ms" if target else "",
            met,
        )
    if name == "async dispatch" and row["unit"] == "ms":  # the loop lag
        return (
            name,
            f"{case}; slowest request plain {_num(row['plain_slowest_ms'])} ms,"
            f" ours {_num(row['ours_slowest_ms'])} ms",
            f"worst tick {_num(row['plain_tick_ms'], 1)} ms",
            f"worst tick {_num(row['ours_tick_ms'], 1)} ms",
            "",
            f"<= {_num(target)} ms",
            "yes" if row["ours_tick_ms"] <= target else "NO",
        )
    if name in ("no blocking", "retry isolation"):
        met = "" if target is None else ("yes" if row["ratio"] >= target else "NO")
        return (
            name,
            case,
            _num(row["baseline"]),
            _num(row["value"]),
            f"{row['ratio']:.2f}x",
            f">= {target}x" if target else "",
            met,
        )
    if name == "retry memory" and row["unit"] == "MiB":
        return (
            name,
            case,
            f"worker {_num(row['worker_mib'])} MiB",
            f"sweeper {_num(row['sweeper_peak_mib'])} MiB",
            "",
            f"<= {_num(target)} MiB",
            "yes" if row["value"] <= target else "NO",
        )
    if name == "retry memory":
        met = "yes" if row["ratio"] >= row["target"] else "NO"
        share = "~0" if row["ours"] <= 0 else f"1/{row['ratio']:,.0f}"
        db = (
            f"; DB {_num(row.get('db_bytes_per_row'))} B/row" if row.get("db_bytes_per_row") else ""
        )
        return (
            name,
            case + db,
            f"{_num(row['plain'])} B",
            f"{_num(row['ours'])} B",
            share,
            "<= 1/50",
            met,
        )
    if name == "atomic":
        case = f"{case}; {_num(row['completed_bytes_per_row'])} B per CompletedTask row"
    if name == "workflows":
        case = (
            f"{case}; end to end {_num(row['plain_seconds'], 1)}"
            f" / {_num(row['ours_seconds'], 1)} s,"
            f" chain p50 {_num(row['plain_p50_ms'])} / {_num(row['ours_p50_ms'])} ms,"
            f" p95 {_num(row['plain_p95_ms'])} / {_num(row['ours_p95_ms'])} ms"
        )
    theirs, target = row.get("plain", row.get("peer")), row.get("target")
    met = "" if target is None else ("yes" if row["ratio"] >= target else "NO")
    return (
        name,
        case,
        _num(theirs),
        _num(row["ours"]),
        f"{row['ratio']:.2f}x",
        "" if target is None else f">= {target}x",
        met,
    )


HEADER = ("benchmark", "case", "plain/peer", "ours", "ratio", "target", "met")


def table(rows: Sequence[dict[str, Any]]) -> str:
    """A plain-text table of the results."""
    lines = [HEADER, *(_line(row) for row in rows)]
    widths = [max(len(line[i]) for line in lines) for i in range(len(HEADER))]
    text = [
        "  ".join(cell.ljust(width) for cell, width in zip(line, widths, strict=True))
        for line in lines
    ]
    text.insert(1, "  ".join("-" * width for width in widths))
    return "\n".join(text)


def write_json(rows: Sequence[dict[str, Any]], settings: dict[str, Any], path: Path) -> None:
    """Write the results, the run's settings and the machine to ``path``."""
    path.parent.mkdir(parents=True, exist_ok=True)
    document = {
        "created_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "command": "python -m benchmarks " + " ".join(settings.get("argv", [])),
        "settings": settings,
        "machine": {
            "python": platform.python_version(),
            "platform": platform.platform(),
            "cpus": _cpus(),
            "load_average": _load(),
        },
        "results": list(rows),
    }
    path.write_text(json.dumps(document, indent=2) + "\n")


def _cpus() -> int | None:
    import os

    return os.cpu_count()


def _load() -> list[float] | None:
    import os

    try:
        return list(os.getloadavg())
    except OSError:
        return None
