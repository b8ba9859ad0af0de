"""The durable record of what ran: one append-only file per process, one line per event.

A task appends ``<event> <key> <pid>`` with a single ``os.write`` on an ``O_APPEND`` file,
so the line survives a SIGKILL of its process right after the call, and processes never
interleave. The tests read every file of the directory and count: ``lost`` is the keys
expected but never done, ``duplicates`` is the done events beyond one per key.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

#: A task started running (written before its body).
STARTED = "started"
#: A task's body finished (the event that counts as "ran").
DONE = "done"


def append(directory: str | Path, event: str, key: str) -> None:
    """Record ``event`` for ``key`` in this process's file under ``directory``."""
    path = Path(directory) / f"{os.getpid()}.log"
    line = f"{event} {key} {os.getpid()}\n".encode()
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
    try:
        os.write(fd, line)
    finally:
        os.close(fd)


def events(directory: str | Path, event: str) -> Counter[str]:
    """How many times each key had ``event``, over every process's file."""
    return Counter(key for key, _pid in records(directory, event))


def records(directory: str | Path, event: str) -> list[tuple[str, int]]:
    """Every ``(key, pid)`` that had ``event``, over every process's file."""
    found: list[tuple[str, int]] = []
    for path in Path(directory).glob("*.log"):
        for line in path.read_text().splitlines():
            parts = line.split()
            if len(parts) == 3 and parts[0] == event:
                found.append((parts[1], int(parts[2])))
    return found


@dataclass(frozen=True, kw_only=True)
class Tally:
    """Expected keys against observed executions."""

    expected: frozenset[str]
    seen: Counter[str]

    @property
    def tasks(self) -> int:
        """How many tasks were dispatched (and committed)."""
        return len(self.expected)

    @property
    def lost(self) -> frozenset[str]:
        """Keys expected and never seen."""
        return self.expected - set(self.seen)

    @property
    def duplicates(self) -> int:
        """Executions beyond the first of each key."""
        return sum(self.seen.values()) - len(self.seen)

    @property
    def phantoms(self) -> frozenset[str]:
        """Keys seen but never expected (a rolled-back dispatch that ran anyway)."""
        return frozenset(self.seen) - self.expected

    def summary(self) -> str:
        """One line for assertion messages."""
        return (
            f"tasks={self.tasks} lost={len(self.lost)} duplicates={self.duplicates} "
            f"phantoms={len(self.phantoms)} (lost sample: {sorted(self.lost)[:5]})"
        )


def tally(expected: Iterable[str], seen: Counter[str]) -> Tally:
    """Compare ``expected`` keys with ``seen`` executions."""
    return Tally(expected=frozenset(expected), seen=seen)
