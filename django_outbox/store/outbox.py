"""``DjangoOutboxStore``: the outbox through Django's ORM and its transactions.

Every method takes ``using``, a database alias (``None`` means the running atomic task's
alias, else ``"default"``: :mod:`~django_outbox.store.calls`), and hands
the work to that alias's strategy (:mod:`~django_outbox.store.vendors`) or to the
vendor-independent dead letter code (:mod:`~django_outbox.store.letters`); workflows and
chord joins are :mod:`~django_outbox.store.workflows`. Rows are
written in whatever ``transaction.atomic(using=...)`` block the caller is in; database
errors leave as :class:`~celery_outbox.exceptions.StoreError` with the cause chained.
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from datetime import datetime

from django.db import transaction
from django.db.models import Q

from celery_outbox.records import (
    CancelledRow,
    Claim,
    MessageStatus,
    NewDeadLetter,
    NewMessage,
    StoredDeadLetter,
    StoredMessage,
    cancelled_row,
)
from celery_outbox.storage import PublishCallback, Supersedes
from django_outbox._compat import on_commit_callbacks
from django_outbox.settings import settings
from django_outbox.store import batches, bulk, commits, letters, published
from django_outbox.store.calls import alias_of, refresh_connection, store_errors
from django_outbox.store.claim_threads import DjangoClaimThreads
from django_outbox.store.completions import DjangoCompletions
from django_outbox.store.monitoring import DjangoMonitoring
from django_outbox.store.orm import messages
from django_outbox.store.vendors import strategy_for
from django_outbox.store.wakeups import DjangoWakeups
from django_outbox.store.workflows import DjangoWorkflows, mark_cancelled


class DjangoOutboxStore(
    DjangoCompletions, DjangoWorkflows, DjangoMonitoring, DjangoWakeups, DjangoClaimThreads
):
    """The ORM store ``django_outbox`` installs as the default store in ``ready()``."""

    # -- dispatch -----------------------------------------------------------------------
    def add(
        self,
        message: NewMessage,
        *,
        using: str | None = None,
        supersedes: Supersedes | None = None,
    ) -> int | None:
        """Insert a pending row in the caller's transaction; ``None`` when its task id is
        already pending (``task_id`` is an idempotency key) with a row ``supersedes``
        does not accept."""
        alias = alias_of(using)
        strategy = strategy_for(alias)
        with store_errors("write an outbox row"):
            row_id = strategy.insert(message, alias=alias)
            if row_id is not None:
                return row_id
            accepts = published.superseding(supersedes, task_id=message.task_id, alias=alias)
            if accepts is not None:
                # It may delete a row deferred earlier in this transaction.
                commits.doubt(transaction.get_connection(alias))
                row_id = strategy.supersede(message, accepts, alias=alias)
            return row_id

    def transaction_token(self, *, using: str | None = None) -> Hashable | None:
        """The alias's connection and its open savepoints; ``None`` outside an atomic block."""
        return bulk.token(alias_of(using))

    def add_many(
        self, messages: Sequence[NewMessage], *, using: str | None = None
    ) -> list[int | None]:
        """One multi-row upsert on PostgreSQL and SQLite 3.35+ (:mod:`~.bulk`); else one
        insert per row."""
        alias = alias_of(using)
        if not bulk.can_batch(alias):
            return super().add_many(messages, using=alias)
        with store_errors("write outbox rows"):
            return bulk.upsert_many(messages, alias=alias)

    def on_commit(self, callback: Callable[[], None], *, using: str | None = None) -> None:
        """``transaction.on_commit``: savepoint-aware; at once outside an atomic block."""
        transaction.on_commit(callback, using=alias_of(using))

    def awaits_commit(self, callback: Callable[[], None], *, using: str | None = None) -> bool:
        """Whether ``callback`` is still among the on-commit callbacks of ``using``'s open
        atomic block (under pytest-django's ``django_db``: the test's transaction)."""
        connection = transaction.get_connection(alias_of(using))
        return connection.in_atomic_block and any(
            registered is callback for registered in on_commit_callbacks(connection)
        )

    def defer_publish(
        self, message: StoredMessage, publish: PublishCallback, *, using: str | None = None
    ) -> None:
        """Publish every row a transaction deferred in one callback (:mod:`~.batches`)."""
        batches.defer(message, publish, using=alias_of(using))

    def still_leased(
        self, messages: Sequence[StoredMessage], *, using: str | None = None
    ) -> set[int]:
        """One ``SELECT`` of the ids and leases; each row must hold its message's lease.

        No statement for the rows the commit whose callbacks are running is known to
        have written (:mod:`~django_outbox.store.commits`): born leased, they are leased
        to no one else, since no one takes a row before its lease runs out.
        """
        alias = alias_of(using)
        committed = commits.committed_rows(alias)
        known = {m.id for m in messages if m.id in committed and m.locked_until is not None}
        unknown = [m for m in messages if m.id not in known]
        if not unknown:
            return known
        with store_errors("read outbox leases"):
            return known | strategy_for(alias).still_leased(unknown, alias=alias)

    # -- publishing and sweeping ----------------------------------------------------------
    def claim(
        self,
        ids: Iterable[int],
        *,
        now: datetime,
        lease_until: datetime,
        max_bytes: int | None = None,
        using: str | None = None,
    ) -> Claim:
        """Lease those of ``ids`` that are pending, due and unleased."""
        alias, ids = alias_of(using), list(ids)
        if not ids:
            return Claim(messages=(), lease_until=lease_until)
        with store_errors("claim outbox rows"):
            return strategy_for(alias).claim_ids(
                ids, now=now, lease_until=lease_until, max_bytes=max_bytes, alias=alias
            )

    def claim_due(
        self,
        *,
        now: datetime,
        created_before: datetime,
        limit: int,
        lease_until: datetime,
        max_bytes: int | None = None,
        using: str | None = None,
    ) -> Claim:
        """Lease up to ``limit`` due rows within ``max_bytes``, skipping locked rows."""
        alias = alias_of(using)
        refresh_connection(alias)
        with store_errors("claim outbox rows"):
            return strategy_for(alias).claim_due(
                now=now,
                created_before=created_before,
                limit=limit,
                lease_until=lease_until,
                max_bytes=max_bytes,
                alias=alias,
            )

    def mark_published(
        self,
        claim: Claim,
        ids: Sequence[int],
        *,
        now: datetime,
        keep: bool,
        using: str | None = None,
    ) -> int:
        """Delete (or mark ``published``) the still-leased rows of ``ids``: one statement."""
        alias = alias_of(using)
        if not ids:
            return 0
        strategy = strategy_for(alias)
        with store_errors("mark outbox rows published"):
            if keep:
                return strategy.keep_published(claim, ids, now=now, alias=alias)
            return strategy.delete_published(claim, ids, alias=alias)

    def record_failure(
        self,
        claim: Claim,
        ids: Sequence[int],
        *,
        error: str,
        retry_at: datetime | None,
        using: str | None = None,
    ) -> int:
        """Count a failed publish and release the rows: one ``UPDATE``."""
        alias = alias_of(using)
        if not ids:
            return 0
        with store_errors("record a failed publish"):
            return strategy_for(alias).record_failure(
                claim, ids, error=error, retry_at=retry_at, alias=alias
            )

    def cancel_pending(
        self,
        *,
        ids: Sequence[int] = (),
        task_ids: Sequence[str] = (),
        now: datetime,
        using: str | None = None,
    ) -> list[CancelledRow]:
        """Lock (``SELECT ... FOR UPDATE``), delete and close the workflows of the chosen
        pending rows, in ``transaction.atomic`` (the caller's transaction when open)."""
        alias = alias_of(using)
        if not ids and not task_ids:
            return []
        chosen = Q(id__in=list(ids)) | Q(task_id__in=list(task_ids))
        with store_errors("cancel outbox rows"), transaction.atomic(using=alias):
            found = (
                messages(alias)
                .select_for_update()
                .filter(chosen, status=MessageStatus.PENDING.value)
                .order_by("id")
                .values_list("id", "task_id", "task_name", "options", "locked_until")
            )
            cancelled = [
                cancelled_row(pk, task_id, name, options, leased=lease is not None)
                for pk, task_id, name, options, lease in found
            ]
            if cancelled:
                # It may delete a row deferred earlier in this transaction, to publish on
                # commit: that publisher must read its rows back.
                commits.doubt(transaction.get_connection(alias))
                messages(alias).filter(id__in=[c.id for c in cancelled]).delete()
            for root in dict.fromkeys(c.root_id for c in cancelled):
                mark_cancelled(root, now=now, alias=alias)
        return cancelled

    def reset(self, ids: Iterable[int], *, now: datetime, using: str | None = None) -> int:
        """Make rows pending and due now; a failed row gets a fresh attempt budget."""
        alias, ids = alias_of(using), list(ids)
        if not ids:
            return 0
        with store_errors("reset outbox rows"):
            return strategy_for(alias).reset(ids, now=now, alias=alias)

    def sweep_aliases(self) -> Sequence[str | None]:
        """``DJANGO_OUTBOX_DATABASES``: the aliases the sweep task covers."""
        return list(settings.DATABASES)

    def count_by_status(self, *, using: str | None = None) -> Mapping[MessageStatus, int]:
        """Rows per status, every status present."""
        alias = alias_of(using)
        refresh_connection(alias)
        with store_errors("count outbox rows"):
            counts = messages(alias).counts_by_status()
        return {status: counts.get(status.value, 0) for status in MessageStatus}

    def oldest_pending(self, *, using: str | None = None) -> datetime | None:
        """``created_at`` of the oldest pending row."""
        alias = alias_of(using)
        refresh_connection(alias)
        with store_errors("read the oldest pending row"):
            return messages(alias).oldest_pending_created_at()

    def purge(
        self,
        *,
        statuses: Iterable[MessageStatus],
        older_than: datetime,
        limit: int,
        using: str | None = None,
    ) -> int:
        """Delete up to ``limit`` old rows in ``statuses``: two statements."""
        alias, values = alias_of(using), [MessageStatus(s).value for s in statuses]
        refresh_connection(alias)
        with store_errors("purge outbox rows"):
            return strategy_for(alias).purge(
                statuses=values, older_than=older_than, limit=limit, alias=alias
            )

    # -- deliveries --------------------------------------------------------------------
    def record_delivery(self, task_id: str, *, now: datetime, using: str | None = None) -> int:
        """Add one to the task's delivery count (2 on its first redelivery); committed."""
        with store_errors("count a redelivery"):
            return letters.record_delivery(task_id, now=now, alias=alias_of(using))

    def forget_deliveries(self, task_id: str, *, using: str | None = None) -> None:
        """Drop the task's delivery count (a no-op without one)."""
        with store_errors("clear a delivery count"):
            letters.forget_deliveries(task_id, alias=alias_of(using))

    # -- dead letters -------------------------------------------------------------------
    def add_dead_letter(
        self, letter: NewDeadLetter, *, using: str | None = None, workflow: str | None = None
    ) -> int:
        """Write a dead letter in the caller's transaction (at once outside one), and mark
        its ``workflow`` failed in the same transaction."""
        with store_errors("write a dead letter"):
            return letters.add_dead_letter(letter, alias=alias_of(using), workflow=workflow)

    def get_dead_letter(
        self, letter_id: int, *, using: str | None = None
    ) -> StoredDeadLetter | None:
        """The dead letter with that id, or ``None``."""
        with store_errors("read a dead letter"):
            return letters.get_dead_letter(letter_id, alias=alias_of(using))

    def requeue_dead_letter(
        self,
        letter_id: int,
        message: NewMessage,
        *,
        by: str,
        now: datetime,
        using: str | None = None,
        workflow: str | None = None,
    ) -> tuple[str, int | None]:
        """Add ``message``, mark the letter ``requeued`` and resume its ``workflow``, in one
        transaction."""
        alias = alias_of(using)
        insert = functools.partial(strategy_for(alias).insert, alias=alias)
        with store_errors("requeue a dead letter"):
            return letters.requeue_dead_letter(
                letter_id, message, insert, by=by, now=now, alias=alias, workflow=workflow
            )

    def discard_dead_letter(self, letter_id: int, *, using: str | None = None) -> bool:
        """Mark a ``dead`` letter ``discarded``: one ``UPDATE``."""
        with store_errors("discard a dead letter"):
            return letters.discard_dead_letter(letter_id, alias=alias_of(using))

    def complete_dead_letters(self, task_id: str, *, using: str | None = None) -> int:
        """Mark the task's ``dead`` letters ``completed``: one ``UPDATE``."""
        with store_errors("complete a dead letter"):
            return letters.complete_dead_letters(task_id, alias=alias_of(using))
