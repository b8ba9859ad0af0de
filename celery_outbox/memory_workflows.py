"""``Workflow`` rows and chord joins of :class:`celery_outbox.testing.InMemoryOutboxStore`."""

from __future__ import annotations

import threading
from collections.abc import Mapping
from dataclasses import dataclass, replace
from datetime import datetime

from celery_outbox.join_parts import empty_parts, part_results, with_part
from celery_outbox.storage import OutboxStore
from celery_outbox.workflows import (
    CANCELLABLE,
    WORKFLOW_STATUSES,
    JoinProgress,
    StoredWorkflow,
    WorkflowStatus,
)


@dataclass(frozen=True, kw_only=True)
class MemoryJoin:
    """A chord join row (immutable, so a transaction's snapshot can restore it)."""

    root_id: str
    size: int
    remaining: int
    #: The header parts, as every store's ``results`` column (:mod:`~celery_outbox.join_parts`).
    parts: str
    created_at: datetime


class MemoryWorkflows(OutboxStore):
    """The workflow half of the in-memory store: every change is one step under its lock,
    inside the caller's :meth:`~celery_outbox.testing.InMemoryOutboxStore.atomic` block."""

    workflows: dict[str, StoredWorkflow]
    joins: dict[str, MemoryJoin]
    _lock: threading.RLock

    def keeps_workflows(self) -> bool:
        """``True``: the in-memory store keeps workflows and chord joins."""
        return True

    def add_workflow_steps(
        self, root_id: str, *, name: str, steps: int, now: datetime, using: str | None = None
    ) -> None:
        with self._lock:
            found = self.workflows.get(root_id)
            if found is None:
                self.workflows[root_id] = StoredWorkflow(
                    root_id=root_id,
                    name=name,
                    status="running",
                    steps_total=steps,
                    steps_done=0,
                    created_at=now,
                )
            else:
                self.workflows[root_id] = replace(found, steps_total=found.steps_total + steps)

    def workflow_step_done(self, root_id: str, *, now: datetime, using: str | None = None) -> None:
        with self._lock:
            found = self.workflows.get(root_id)
            if found is None:
                return
            done = min(found.steps_done + 1, found.steps_total)
            if found.status == "running" and found.steps_done + 1 >= found.steps_total:
                found = replace(found, status="succeeded", finished_at=now)
            self.workflows[root_id] = replace(found, steps_done=done)

    def workflow_failed(
        self, root_id: str, task_id: str, *, now: datetime, using: str | None = None
    ) -> None:
        with self._lock:
            found = self.workflows.get(root_id)
            if found is not None and found.status != "cancelled":
                self.workflows[root_id] = replace(
                    found, status="failed", failed_task_id=task_id, finished_at=now
                )

    def workflow_cancelled(self, root_id: str, *, now: datetime, using: str | None = None) -> None:
        with self._lock:
            found = self.workflows.get(root_id)
            if found is None or found.status not in CANCELLABLE:
                return
            self.workflows[root_id] = replace(found, status="cancelled", finished_at=now)
            for group_id in [g for g, join in self.joins.items() if join.root_id == root_id]:
                del self.joins[group_id]

    def workflow_resumed(self, root_id: str, *, using: str | None = None) -> None:
        with self._lock:
            found = self.workflows.get(root_id)
            if found is not None and found.status == "failed":
                self.workflows[root_id] = replace(found, status="running", finished_at=None)

    def get_workflow(self, root_id: str, *, using: str | None = None) -> StoredWorkflow | None:
        return self.workflows.get(root_id)

    def count_workflows(
        self, *, using: str | None = None, bound: int | None = None
    ) -> Mapping[WorkflowStatus, int]:
        counts = dict.fromkeys(WORKFLOW_STATUSES, 0)
        with self._lock:
            for workflow in self.workflows.values():
                counts[workflow.status] += 1
        return counts

    def open_join(
        self, group_id: str, *, root_id: str, size: int, now: datetime, using: str | None = None
    ) -> None:
        with self._lock:
            if group_id not in self.joins:
                self.joins[group_id] = MemoryJoin(
                    root_id=root_id,
                    size=size,
                    remaining=size,
                    parts=empty_parts(size),
                    created_at=now,
                )

    def join_part(
        self, group_id: str, index: int, result: str | None, *, using: str | None = None
    ) -> JoinProgress | None:
        with self._lock:
            join = self.joins.get(group_id)
            if join is None:
                return None
            parts = with_part(join.parts, index, result)
            if parts is not None:
                join = replace(join, remaining=join.remaining - 1, parts=parts)
                self.joins[group_id] = join
            return JoinProgress(remaining=join.remaining, results=part_results(join.parts))

    def purge_joins(self, *, older_than: datetime, limit: int, using: str | None = None) -> int:
        with self._lock:
            doomed = [
                key
                for key, join in self.joins.items()
                if join.remaining == 0 and join.created_at < older_than
            ][: max(limit, 0)]
            for key in doomed:
                del self.joins[key]
            return len(doomed)
