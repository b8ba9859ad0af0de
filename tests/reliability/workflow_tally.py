"""What the workflow chaos scenario dispatches and how its runs are tallied.

Chain ``c`` is ``step(0) → step → step → step → step``: its step ``j`` records key
``<prefix>ch<c>-s<j>`` with value ``j``. Chord ``c`` has ``HEADER`` steps ``step(100c + i)``
recording ``<prefix>cd<c>-h<i>`` with ``100c + i + 1``, and a body recording
``<prefix>cd<c>-body`` with every header value in header order.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from celery import Celery, chain, chord

from tests.reliability.workflow_chaos_app import COLLECT, PLAIN_COLLECT, PLAIN_STEP, STEP

#: Chains, and steps per chain.
CHAINS, CHAIN_STEPS = 100, 5
#: Chords, and header steps per chord (each plus its body).
CHORDS, HEADER = 50, 10
#: Steps of the whole scenario, per variant.
STEPS = CHAINS * CHAIN_STEPS + CHORDS * (HEADER + 1)


def canvases(app: Celery, prefix: str, *, plain: bool) -> list[Any]:
    """Every chain and chord of the scenario (chains and chords interleaved)."""
    step, collect = (
        app.tasks[PLAIN_STEP if plain else STEP],
        app.tasks[PLAIN_COLLECT if plain else COLLECT],
    )
    chains = [
        chain(
            step.s(0, f"{prefix}ch{c}-s1"),
            *(step.s(f"{prefix}ch{c}-s{j}") for j in range(2, CHAIN_STEPS + 1)),
        )
        for c in range(CHAINS)
    ]
    chords = [
        chord(
            [step.s(100 * c + i, f"{prefix}cd{c}-h{i}") for i in range(HEADER)],
            collect.s(f"{prefix}cd{c}-body"),
        )
        for c in range(CHORDS)
    ]
    mixed: list[Any] = []
    for index, canvas in enumerate(chains):
        mixed.append(canvas)
        if index % 2 == 1:
            mixed.append(chords[index // 2])
    return mixed


def expected(prefix: str) -> dict[str, Any]:
    """Every key the scenario's steps record, with the value each must record."""
    found: dict[str, Any] = {}
    for c in range(CHAINS):
        found.update({f"{prefix}ch{c}-s{j}": j for j in range(1, CHAIN_STEPS + 1)})
    for c in range(CHORDS):
        header = [100 * c + i + 1 for i in range(HEADER)]
        found.update({f"{prefix}cd{c}-h{i}": value for i, value in enumerate(header)})
        found[f"{prefix}cd{c}-body"] = header
    return found


@dataclass(frozen=True, kw_only=True)
class WorkflowTally:
    """Expected steps against committed runs: lost, duplicated and wrong, bodies apart."""

    lost: int
    duplicates: int
    wrong: int
    bodies_lost: int
    bodies_duplicated: int
    bodies_wrong: int

    def summary(self) -> str:
        """One line for messages."""
        return (
            f"lost={self.lost} duplicates={self.duplicates} wrong={self.wrong} "
            f"bodies_lost={self.bodies_lost} bodies_duplicated={self.bodies_duplicated} "
            f"bodies_wrong={self.bodies_wrong}"
        )


def tally(expect: dict[str, Any], runs: Iterable[tuple[str, Any]]) -> WorkflowTally:
    """Compare ``expect`` (key: value) with committed ``runs`` (key, value)."""
    seen: Counter[str] = Counter()
    wrong: set[str] = set()
    for key, value in runs:
        seen[key] += 1
        if expect.get(key, object()) != value:
            wrong.add(key)
    bodies = {key for key in expect if key.endswith("-body")}
    lost = set(expect) - set(seen)
    extra = {key: n - 1 for key, n in seen.items() if n > 1}
    return WorkflowTally(
        lost=len(lost - bodies),
        duplicates=sum(n for key, n in extra.items() if key not in bodies),
        wrong=len(wrong - bodies),
        bodies_lost=len(lost & bodies),
        bodies_duplicated=sum(n for key, n in extra.items() if key in bodies),
        bodies_wrong=len(wrong & bodies),
    )


def bodies_lost_after_a_duplicate(prefix: str, runs: Iterable[tuple[str, Any]]) -> int:
    """Chord bodies that never ran although a header step of theirs ran twice (how a
    backend's chord counter overshoots and never meets the header's size).
    """
    seen = Counter(key for key, _value in runs)
    return sum(
        1
        for c in range(CHORDS)
        if not seen[f"{prefix}cd{c}-body"]
        and any(seen[f"{prefix}cd{c}-h{i}"] > 1 for i in range(HEADER))
    )
