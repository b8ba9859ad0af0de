"""The status rules of every store, said once: which statuses a row may leave, and to what.

A dead letter leaves ``dead`` once (requeued, discarded, or completed by a duplicate
delivery); a workflow closes as ``succeeded`` when its last step is counted while it
runs, ``failed`` unless it was cancelled, ``cancelled`` from ``running`` or ``failed``,
and a ``failed`` one runs again when its dead letter is requeued. Each store writes these
rules into its own statements (a ``WHERE`` on the status, a compare-and-set, a check under
its lock) from the :class:`Transition` constants here, never from literals of its own;
``tests/contract`` proves the stores act alike.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Generic, TypeVar

from celery_outbox.store.records import DeadLetterStatus, WorkflowStatus

#: The stored values of one status column (a workflow's are a ``Literal``).
Value = TypeVar("Value", bound=str)


@dataclass(frozen=True)
class Transition(Generic[Value]):
    """A status change a store may make: from any of ``sources`` to ``target``, each the
    value the status column stores (a ``WHERE status IN (...)``, a compare-and-set).
    """

    sources: tuple[Value, ...]
    target: Value

    def allows(self, status: str) -> bool:
        """Whether a row in ``status`` (a stored value, or a status enum) may take it."""
        return any(status == source for source in self.sources)


# --- Dead letters: each leaves ``dead`` once; a second requeue or discard changes nothing.

_DEAD = (DeadLetterStatus.DEAD.value,)
#: An operator requeues the letter: a new task id is dispatched, recorded on the letter.
REQUEUE: Transition[str] = Transition(_DEAD, DeadLetterStatus.REQUEUED.value)
#: An operator discards the letter.
DISCARD: Transition[str] = Transition(_DEAD, DeadLetterStatus.DISCARDED.value)
#: The letter's task finished through a duplicate delivery: never requeued by mistake.
COMPLETE: Transition[str] = Transition(_DEAD, DeadLetterStatus.COMPLETED.value)

# --- Workflows: ``cancelled`` is final; ``failed`` runs again when its letter is requeued.

#: The last step is counted while the workflow runs.
SUCCEED: Transition[WorkflowStatus] = Transition(("running",), "succeeded")
#: A step is dead-lettered: the workflow fails, unless it was cancelled.
FAIL: Transition[WorkflowStatus] = Transition(("running", "succeeded", "failed"), "failed")
#: A step is cancelled: its workflow closes (a chord waiting on it too).
CANCEL: Transition[WorkflowStatus] = Transition(("running", "failed"), "cancelled")
#: The failed step's dead letter is requeued: the workflow runs again.
RESUME: Transition[WorkflowStatus] = Transition(("failed",), "running")
