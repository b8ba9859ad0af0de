"""The store's part in atomic tasks: one transaction per run, keyed by the task id.

An atomic task (``OutboxTask.atomic``) runs its body inside
:meth:`CompletionStore.complete_once`: the store opens a transaction on the task's
database, inserts the task's ``CompletedTask`` row first (so a concurrent duplicate waits
on that key), lets the body write and dispatch in the same transaction, then writes the
result and commits. A task id that already has a row is a duplicate: the block is told so
and must not run the body. The worker side is :mod:`celery_outbox.worker.atomic`.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from datetime import datetime

from celery_outbox.exceptions import AtomicUnsupported
from celery_outbox.records import NewMessage, StoredCompletion, StoredMessage


@dataclass
class Completion:
    """One atomic run, as :meth:`CompletionStore.complete_once` yields it.

    ``previous`` is the committed row of an earlier run of the same task id: the body
    must not run. Otherwise the caller sets ``result`` (the serialised return value)
    before the block ends; it is written with the row.
    """

    task_id: str
    task_name: str
    previous: StoredCompletion | None = None
    result: str | None = None


class CompletionStore:
    """The ``CompletedTask`` rows of atomic tasks (a part of every
    :class:`~celery_outbox.storage.OutboxStore`).

    A store that cannot run atomic tasks keeps these defaults: :meth:`atomic_problem`
    says why, and the worker refuses to start an atomic task on it.
    """

    def atomic_problem(self, using: str | None = None) -> str | None:
        """Why atomic tasks cannot run on ``using`` (a sentence), or ``None`` if they can."""
        return f"{type(self).__name__} does not run atomic tasks"

    def complete_once(
        self,
        task_id: str,
        task_name: str,
        *,
        now: datetime,
        using: str | None = None,
        root_id: str | None = None,
    ) -> AbstractContextManager[Completion]:
        """A transaction on ``using`` that inserts ``task_id``'s ``CompletedTask`` row first
        (with ``root_id``: the workflow the task is a step of, ``None`` outside one).

        When a committed row exists (or one being written commits while this waits on
        the key) the block gets :attr:`Completion.previous` and must not run the body.
        Otherwise everything the block writes, and every dispatch made in it with
        ``using=None`` (the task's alias), joins this transaction; leaving the block
        writes :attr:`Completion.result` with the row and commits, raising rolls all of
        it back (a duplicate may then run). ``completed_at`` is ``now``.

        Raises
        ------
        AtomicUnsupported
            When :meth:`atomic_problem` has a reason.
        """
        raise AtomicUnsupported(f"{self.atomic_problem(using)} (database {using!r}).")

    def hand_on(
        self,
        message: NewMessage,
        publish: Callable[[Sequence[StoredMessage]], object],
        *,
        using: str | None = None,
    ) -> bool:
        """Take ``message``, a successor an atomic run hands on at its end, to write with
        the run's last writes (its row inserted as by ``add`` with no ``supersedes``, in
        the same transaction, before the commit) and publish after the commit as by
        ``defer_publish``; if the row is not written (a pending row has its task id),
        nothing is published. ``False`` (the default): not taken, the caller adds it.

        Only for a message no one needs the row id of before the commit (no
        ``task_dispatched`` receiver), not superseding, born leased.
        """
        return False

    def completion(self, task_id: str, *, using: str | None = None) -> StoredCompletion | None:
        """The committed ``CompletedTask`` row of ``task_id``, or ``None``."""
        return None

    def count_completed(self, *, using: str | None = None) -> int:
        """How many ``CompletedTask`` rows there are."""
        return 0

    def purge_completed(self, *, older_than: datetime, limit: int, using: str | None = None) -> int:
        """Delete up to ``limit`` ``CompletedTask`` rows completed before ``older_than``
        (bounded: one statement); return how many."""
        return 0
