"""The demo's terminal output: a live table while retries back off, then the summary.

With ``rich`` (in the ``dev`` extra) and a terminal, progress is a live table; otherwise
(a pipe, a CI log) it is one line every two seconds.
"""

from __future__ import annotations

import sys
import time
from pathlib import Path
from types import TracebackType
from typing import Any

from shop.fulfilment import CARRIER
from shop.fulfilment_report import Fulfilment
from shop.models import CHANNELS
from shop.report import Progress, Summary

try:
    from rich.console import Console, Group
    from rich.live import Live
    from rich.progress_bar import ProgressBar
    from rich.table import Table
except ImportError:  # rich is optional: plain lines then
    Console = None  # type: ignore[assignment,misc]


class Display:
    """Shows a :class:`~shop.report.Progress` as it changes."""

    def __init__(self, *, total: int, outage_dir: Path) -> None:
        self.total, self.outage_dir = total, outage_dir
        self.console = Console() if Console is not None else None
        self.live: Any = None
        self._last_line = 0.0

    def __enter__(self) -> Display:
        if self.console is not None and self.console.is_terminal:
            self.live = Live(console=self.console, refresh_per_second=8, transient=False)
            self.live.__enter__()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if self.live is not None:
            self.live.__exit__(kind, exc, tb)

    def update(self, state: Progress, elapsed: float) -> None:
        """Show ``state``, ``elapsed`` seconds after the first order."""
        if self.live is not None:
            self.live.update(self._renderable(state, elapsed))
        elif time.monotonic() - self._last_line >= 2.0 or state.done:
            self._last_line = time.monotonic()
            print(self._line(state, elapsed), flush=True)

    def _provider(self, channel: str) -> str:
        return "DOWN" if (self.outage_dir / f"{channel}.down").exists() else "up"

    def _line(self, state: Progress, elapsed: float) -> str:
        channels = " | ".join(
            f"{name} ({self._provider(name)}) {c['delivered']} delivered {c['queued']} queued "
            f"{c['dead']} dead"
            for name, c in state.by_channel.items()
        )
        return (
            f"[{elapsed:5.1f} s] settled {state.settled}/{state.orders} | {channels} | "
            f"dead letters {state.dead_letters}, parked now {state.parked_waiting} | "
            f"fulfilment (carrier {self._provider(CARRIER)}) {_workflows(state.workflows)}"
        )

    def _renderable(self, state: Progress, elapsed: float) -> Any:
        table = Table(title=f"Notifications, {elapsed:.1f} s after the first order")
        for column in ("channel", "provider", "queued", "delivered", "dead (dead letter)"):
            table.add_column(
                column, justify="left" if column in ("channel", "provider") else "right"
            )
        for channel in CHANNELS:
            counts = state.by_channel[channel.value]
            provider = self._provider(channel.value)
            table.add_row(
                channel.label,
                f"[red]{provider}[/]" if provider == "DOWN" else provider,
                str(counts["queued"]),
                str(counts["delivered"]),
                str(counts["dead"]),
            )
        retries = max(state.attempts - sum(sum(c.values()) for c in state.by_channel.values()), 0)
        footer = (
            f"orders settled {state.settled}/{self.total}   task runs {state.attempts}"
            f" (~{retries} retries)   retries parked in the outbox now "
            f"{state.parked_waiting}   dead letters {state.dead_letters}"
        )
        workflows = (
            f"fulfilment workflows (carrier {self._provider(CARRIER)}): "
            f"{_workflows(state.workflows)}"
        )
        bar = ProgressBar(total=max(self.total, 1), completed=state.settled, width=60)
        return Group(bar, table, footer, workflows)


def print_summary(
    summary: Summary, *, elapsed: float, settled: bool, sweep_interval: float, park_after: float
) -> None:
    """Print the summary, saying what each number measures."""
    out = sys.stdout.write
    state = "every order settled" if settled else "TIMED OUT: some orders did not settle"
    out(f"\nSummary, counted from the database ({state}, {elapsed:.1f} s after the first order):\n")
    rows = [("orders", summary.orders, "")]
    rows += [
        (f"delivered by {channel.label}", summary.delivered[channel.value], "")
        for channel in CHANNELS
    ]
    rows += [
        ("undeliverable", summary.undeliverable, "every channel became a dead letter"),
        ("task runs", summary.attempts, f"over {summary.notifications} notifications"),
        (
            "retries",
            summary.retries,
            f"{summary.eta_retries} on a broker ETA, {summary.parked_retries} parked in the "
            f"outbox table (waits > {park_after:g} s)",
        ),
        (
            "dead letters",
            summary.dead_letters,
            ", ".join(
                f"{name} {n}" for name, n in sorted(summary.dead_letters_by_exception.items())
            ),
        ),
    ]
    for label, value, note in rows:
        out(f"  {label:<24}{value:>6}   {note}\n".rstrip() + "\n")
    out(
        f"  {'publish latency':<24}{_percentiles(summary.publish_latency_ms)}\n"
        f"  {'':<24}outbox row written in the dispatching transaction -> marked published\n"
        f"  {'':<24}after COMMIT (the order's push, and each fail-over's next channel)\n"
    )
    out(
        f"  {'parked retry lag':<24}{_percentiles(summary.parked_lag_ms)}\n"
        f"  {'':<24}retry due -> published by the sweeper (beat every {sweep_interval:g} s)\n"
    )
    print_fulfilment(summary.fulfilment)


def print_fulfilment(done: Fulfilment) -> None:
    """Print the fulfilment workflows and the check that each step took effect once."""
    out = sys.stdout.write
    out("\nFulfilment workflows (reserve_stock -> chord(pack_item per item) -> ship):\n")
    rows = [(status, n, "") for status, n in done.workflows.items()]
    rows += [
        ("reserved once", done.reserved_once, f"of {done.orders} orders"),
        ("packed once", done.packed_once, f"of {done.items} items"),
        ("shipped once", done.shipped_once, "orders, items in the chord header's order"),
        ("duplicate effects", done.duplicates, ""),
        (
            "carrier retries",
            done.ship_retries,
            f"of the ship steps, {done.parked_retries} parked in the outbox table",
        ),
    ]
    for label, value, note in rows:
        out(f"  {label:<24}{value:>6}   {note}\n".rstrip() + "\n")
    verdict = "every step took effect exactly once" if done.exactly_once else "NOT exactly once"
    out(f"  {'':<24}{verdict}\n")


def _workflows(counts: dict[str, int]) -> str:
    return ", ".join(f"{n} {status}" for status, n in counts.items())


def _percentiles(stats: dict[str, float | int]) -> str:
    if not stats.get("count"):
        return "  none measured"
    return (
        f"  p50 {stats['p50']} ms, p99 {stats['p99']} ms, max {stats['max']} ms "
        f"(n={stats['count']})"
    )
