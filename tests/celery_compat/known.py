"""Why a test of Celery's integration suite differs on the outbox (docs/celery-compat.md).

Each entry maps a pattern of test node ids (``fnmatch``) to its reason: an intended
difference of ``OutboxTask`` and the option that restores Celery's behaviour, or a test
that races itself. A difference with no entry here is a bug until explained.
"""

from __future__ import annotations

from fnmatch import fnmatch

#: The subset CI runs on every change (pytest ``-k``): task replacement and the chain.
FAST = "test_task_replacement or (test_chain and replace) or test_apply_tasks"

KNOWN: dict[str, str] = {}


def reason_for(node_id: str) -> str | None:
    """The known reason why ``node_id`` differs on the outbox, or ``None``."""
    return next((why for pattern, why in KNOWN.items() if fnmatch(node_id, pattern)), None)
