"""Who lost a task: the outbox (never accepted by the broker) or past the broker.

Each lost key is looked up in the broker's durable record (the Redis AOF, replayed by
:mod:`tests.reliability.aof`), by the task id of the kombu envelope (``headers.id``; the
reliability tests use the key as the task id) or, failing that, the key in its
``argsrepr`` header:

- ``by_outbox``: never pushed onto the task queue. The broker never accepted it, so the
  outbox deleted (or never wrote) a row without a publish: a bug of the outbox.
- ``past_broker``: pushed, then taken by the last pop from the queue that the broker
  logged before a kill, never pushed back, never recorded in kombu's ``unacked`` hash
  after that pop, and never run. This is kombu's Redis consumer window
  (https://github.com/celery/kombu/issues/305, https://github.com/celery/kombu/issues/1733):
  ``BRPOP`` removed the message and the server died before the reply reached the worker,
  so the worker never put it in ``unacked``. Only the last pop counts: one pop is in
  flight per consuming connection, and the reliability worker has one.
- ``unexplained``: anything else (still queued at the end, taken by any other pop, or
  parked in ``unacked``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from tests.reliability.aof import Op

#: kombu's Redis transport keeps delivered, unacknowledged messages in this hash.
UNACKED_HASH = b"unacked"


@dataclass(frozen=True, kw_only=True)
class Attribution:
    """The lost keys by culprit, with a one-line history of each (for reports)."""

    by_outbox: frozenset[str]
    past_broker: frozenset[str]
    unexplained: frozenset[str]
    history: dict[str, str] = field(default_factory=dict)


def message_id(value: bytes) -> str | None:
    """The task id of a kombu envelope (or of an ``unacked`` entry); ``None`` if not one."""
    try:
        decoded: Any = json.loads(value)
    except ValueError:
        return None
    if isinstance(decoded, list) and decoded:
        decoded = decoded[0]  # unacked entries are [envelope, exchange, routing_key]
    headers = decoded.get("headers") if isinstance(decoded, dict) else None
    if not isinstance(headers, dict):
        return None
    task_id = headers.get("id")
    return str(task_id) if task_id is not None else None


def _matches(op: Op, key: str) -> bool:
    # Only for values that are not kombu envelopes: the key in an argsrepr-like text.
    return json.dumps(key).encode() in op.value or repr((key,)).encode() in op.value


def is_queue(name: bytes, queue: str) -> bool:
    """Whether list ``name`` is ``queue`` or one of kombu's priority lists of it."""
    encoded = queue.encode()
    return name == encoded or name.startswith(encoded + b"\x06\x16")


def attribute(
    lost: Iterable[str], ops: Sequence[Op], *, queue: str, kills: Sequence[int]
) -> Attribution:
    """Classify each ``lost`` key from the replayed ``ops``.

    ``kills`` are the broker's kills, each as the number of AOF commands written before
    it (read from the file while the server was down).
    """
    relevant = [op for op in ops if is_queue(op.key, queue) or op.key == UNACKED_HASH]
    pops = [op.index for op in relevant if op.kind == "pop" and is_queue(op.key, queue)]
    last_pops = {max((i for i in pops if i < kill), default=-1) for kill in kills}
    by_id: dict[str, list[Op]] = {}
    for op in relevant:
        by_id.setdefault(message_id(op.value) or "", []).append(op)
    groups: dict[str, list[str]] = {"by_outbox": [], "past_broker": [], "unexplained": []}
    history: dict[str, str] = {}
    for key in sorted(lost):
        mine = by_id.get(key) or [op for op in by_id.get("", []) if _matches(op, key)]
        verdict = _classify(mine, queue, last_pops)
        groups[verdict].append(key)
        history[key] = f"{verdict}: " + (" ".join(_describe(op) for op in mine) or "no AOF op")
    return Attribution(
        by_outbox=frozenset(groups["by_outbox"]),
        past_broker=frozenset(groups["past_broker"]),
        unexplained=frozenset(groups["unexplained"]),
        history=history,
    )


def _classify(mine: list[Op], queue: str, last_pops: set[int]) -> str:
    on_queue = [op for op in mine if is_queue(op.key, queue)]
    if not any(op.kind == "push" for op in on_queue):
        return "by_outbox"
    last = on_queue[-1]
    if last.kind != "pop" or last.index not in last_pops:
        return "unexplained"
    parked = any(op.key == UNACKED_HASH and op.index >= last.index for op in mine)
    return "unexplained" if parked else "past_broker"


def _describe(op: Op) -> str:
    where = "unacked" if op.key == UNACKED_HASH else "queue"
    return f"{op.kind}({where})@{op.timestamp}#{op.index}"
