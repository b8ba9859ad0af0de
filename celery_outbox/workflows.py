"""The store's part in durable workflows: ``Workflow`` rows and chord joins.

A canvas of ``OutboxTask`` s (Celery's ``chain``, ``group``, ``chord``) gets one
``Workflow`` row, keyed by the ``root_id`` Celery gives its tasks, written in the
transaction that dispatched it; each step's completion counts in the step's own
transaction. A chord whose header is made of atomic ``OutboxTask`` s has a join row
(keyed by the chord's group id) counting its header steps in the database, so it needs no
result backend. The worker side is :mod:`celery_outbox.worker.canvas`.

Every method here writes in the caller's current transaction on ``using`` (the
dispatching transaction, or the atomic step's), like :meth:`OutboxStore.add`, unless it
says otherwise. A store that keeps these defaults has no workflow rows and no
database chord joins: canvases keep Celery's own behaviour on it.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal

WorkflowStatus = Literal["running", "succeeded", "failed", "cancelled"]
#: Every workflow status, in the order surfaces list them.
WORKFLOW_STATUSES: tuple[WorkflowStatus, ...] = ("running", "succeeded", "failed", "cancelled")
#: The statuses a cancelled step closes its workflow from (it ends ``cancelled``).
CANCELLABLE: tuple[WorkflowStatus, ...] = ("running", "failed")


@dataclass(frozen=True, kw_only=True)
class StoredWorkflow:
    """A ``Workflow`` row."""

    root_id: str
    name: str
    status: WorkflowStatus
    steps_total: int
    steps_done: int
    created_at: datetime
    finished_at: datetime | None = None
    failed_task_id: str | None = None


@dataclass(frozen=True, kw_only=True)
class JoinProgress:
    """A chord join after one header step counted: ``remaining`` steps to go, and the
    results stored so far in header order (``None`` where not in yet, or a step that
    returned ``None``)."""

    remaining: int
    results: list[str | None] = field(default_factory=list)


class WorkflowStore:
    """``Workflow`` rows and chord joins (a part of every
    :class:`~celery_outbox.storage.OutboxStore`; these defaults keep none)."""

    def keeps_workflows(self) -> bool:
        """Whether this store keeps ``Workflow`` rows and chord joins."""
        return False

    def add_workflow_steps(
        self, root_id: str, *, name: str, steps: int, now: datetime, using: str | None = None
    ) -> None:
        """Create ``root_id``'s workflow (``running``, ``steps_total=steps``, ``name``,
        ``created_at=now``) or add ``steps`` to the ``steps_total`` of the existing row
        (its name and status unchanged). Concurrent callers never lose an addition."""

    def workflow_step_done(self, root_id: str, *, now: datetime, using: str | None = None) -> None:
        """Count one step of ``root_id`` done (``steps_done`` never past ``steps_total``);
        the step that reaches ``steps_total`` of a ``running`` workflow makes it
        ``succeeded`` with ``finished_at=now``. No such workflow: nothing."""

    def workflow_failed(
        self, root_id: str, task_id: str, *, now: datetime, using: str | None = None
    ) -> None:
        """Mark ``root_id``'s workflow ``failed`` by ``task_id`` (``failed_task_id``,
        ``finished_at=now``) unless it was cancelled. No such workflow: nothing."""

    def workflow_cancelled(self, root_id: str, *, now: datetime, using: str | None = None) -> None:
        """Close ``root_id``'s ``running`` or ``failed`` workflow as ``cancelled``
        (``finished_at=now``, ``failed_task_id`` kept) and delete its chord joins (their
        bodies can never run). A cancelled workflow stays cancelled: a later step done,
        failed or resumed leaves its status, and a second cancel its ``finished_at`` and
        any join opened since. A ``succeeded`` workflow is left as it is. No such
        workflow: nothing."""

    def workflow_resumed(self, root_id: str, *, using: str | None = None) -> None:
        """A ``failed`` workflow goes back to ``running`` (``finished_at`` cleared,
        ``failed_task_id`` kept as the last failure). No such workflow: nothing."""

    def get_workflow(self, root_id: str, *, using: str | None = None) -> StoredWorkflow | None:
        """``root_id``'s workflow, or ``None`` (its own read, committed data)."""
        return None

    def count_workflows(
        self, *, using: str | None = None, bound: int | None = None
    ) -> Mapping[WorkflowStatus, int]:
        """How many workflows there are per status (every status present, 0 when none);
        ``bound`` as for :meth:`~celery_outbox.monitoring.MonitoredStore.backlog`."""
        return dict.fromkeys(WORKFLOW_STATUSES, 0)

    def open_join(
        self, group_id: str, *, root_id: str, size: int, now: datetime, using: str | None = None
    ) -> None:
        """Create the join of chord ``group_id`` waiting for ``size`` header steps. A join
        that exists already is left as it is (a chord is opened once per group id)."""

    def join_part(
        self, group_id: str, index: int, result: str | None, *, using: str | None = None
    ) -> JoinProgress | None:
        """Count header step ``index`` of chord ``group_id`` with its ``result``: lock
        the join row (concurrent steps wait on it), store the result at ``index`` and
        take one off ``remaining``, and return the progress. A step counted already (its
        index done) changes nothing. ``None`` when the chord has no join row (it was
        not opened by this library: Celery's result backend joins it).

        Raises
        ------
        IndexError
            When ``index`` is outside the chord's header.
        """
        return None

    def purge_joins(self, *, older_than: datetime, limit: int, using: str | None = None) -> int:
        """Delete up to ``limit`` joins of chords done (``remaining`` 0) created before
        ``older_than``; return how many (its own transaction)."""
        return 0
