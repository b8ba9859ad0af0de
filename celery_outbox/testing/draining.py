"""Draining a test's outbox: run each held task in the test process, or publish its row.

While :func:`publishing_held` is active the app's on-commit publisher publishes nothing,
so every row a test dispatched stays ``pending`` in the store, as it would if the broker
were down, until the test drains it. Draining takes rows by id: the rows a rollback
dropped do not exist, so only what the test's transactions kept is run or published.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

from celery import Celery

from celery_outbox.config import OutboxConfig
from celery_outbox.dispatch.envelope import decode_body
from celery_outbox.registry import store_for
from celery_outbox.relay.relay import PublishReport, Relay, relay_for
from celery_outbox.state import state_of
from celery_outbox.store.records import Claim, StoredMessage
from celery_outbox.testing.expectations import Dispatch, Drained

#: How long a drain holds the rows it claimed (it releases them at once when done).
DRAIN_LEASE = timedelta(minutes=5)


class HeldRelay(Relay):
    """A relay whose on-commit publisher publishes nothing (rows stay pending); the
    other entry points (a drain's :meth:`publish_claim`) reach the broker as usual.
    """

    def publish_committed(
        self, messages: Sequence[StoredMessage], *, using: str | None = None
    ) -> PublishReport:
        """Leave the committed rows pending, for the test to drain."""
        return PublishReport()


@contextmanager
def publishing_held(app: Celery) -> Iterator[HeldRelay]:
    """Within this block, ``app``'s dispatches write rows that are not published on
    commit; the relay ``app`` had before is restored afterwards.
    """
    state = state_of(app)
    previous = state.relay
    held = HeldRelay(app, store=store_for(app), config=OutboxConfig.from_celery(app))
    state.relay = held
    try:
        yield held
    finally:
        if state_of(app).relay is held:
            state_of(app).relay = previous
        held.close()


def claim_rows(app: Celery, ids: Sequence[int], *, using: str | None) -> Claim:
    """Claim the existing pending rows of ``ids``, due or not (ETA and parked rows are
    made due now), in the order they were written.
    """
    store = store_for(app)
    now = store.now(using=using)
    store.reset(ids, now=now, using=using)
    claim = store.claim(ids, now=now, lease_until=now + DRAIN_LEASE, using=using)
    ordered = tuple(sorted(claim.messages, key=lambda m: m.id))
    return Claim(messages=ordered, lease_until=claim.lease_until)


def run_claimed(app: Celery, claim: Claim, message: StoredMessage, *, using: str | None) -> Any:
    """Remove ``message``'s row as a publish would, then run its task in this process
    (eagerly, as under ``task_always_eager``); the task's exception propagates.

    Raises
    ------
    LookupError
        When ``app`` has no task of that name (its module was never imported).
    """
    task = app.tasks.get(message.task_name)
    if task is None:
        raise LookupError(
            f"drain() cannot run {message.task_name!r} (task id {message.task_id}): app "
            f"{app.main!r} has no task of that name. Import the module that defines it."
        )
    store = store_for(app)
    keep = OutboxConfig.from_celery(app).keep_published > timedelta(0)
    store.mark_published(claim, [message.id], now=store.now(using=using), keep=keep, using=using)
    args, kwargs, _embed = decode_body(
        message.payload, message.options, accept=app.conf.accept_content, max_bytes=None
    )
    return task.apply(args, kwargs, task_id=message.task_id, throw=True).get()


def publish_claimed(app: Celery, claim: Claim, *, using: str | None) -> PublishReport:
    """Publish the claimed rows to ``app``'s broker, as the sweeper would (validated)."""
    return relay_for(app).publish_claim(claim, using=using, validate=True)


def missing_rows_message(missing: Sequence[Dispatch]) -> str:
    """Why ``drain()`` failed: kept dispatches whose row is not in the outbox."""
    lines = "\n  - ".join(d.describe() for d in missing)
    return (
        f"drain() found no pending outbox row for {len(missing)} kept dispatch(es):\n  - {lines}\n"
        "Likely causes: a sweeper, relay or worker published or deleted the row during the "
        "test; or the row is in a transaction the store's connection cannot see (the "
        "SQLAlchemy store claims through its engine: commit the session before draining)."
    )


def publish_failed_message(failed: Mapping[int, str], by_row: Mapping[Any, Dispatch]) -> str:
    """Why ``drain(publish=True)`` failed: each row's dispatch and publish error."""
    lines = "\n  - ".join(f"{by_row[i].describe()}: {error}" for i, error in failed.items())
    return f"drain(publish=True) could not publish {len(failed)} row(s) to the broker:\n  - {lines}"


def by_store(
    dispatches: list[Dispatch], *, default: Celery
) -> dict[tuple[Celery, str | None], list[Dispatch]]:
    """``dispatches`` grouped by the app and database alias their rows are in."""
    groups: dict[tuple[Celery, str | None], list[Dispatch]] = defaultdict(list)
    for dispatch in dispatches:
        groups[(dispatch.app or default, dispatch.using)].append(dispatch)
    return groups


def drain_batch(app: Celery, batch: list[Dispatch], *, using: str | None, publish: bool) -> None:
    """Claim ``batch``'s rows, then run each task here or (``publish``) publish them."""
    __tracebackhide__ = True
    by_row = {d.row_id: d for d in batch}
    claim = claim_rows(app, [d.row_id for d in batch if d.row_id is not None], using=using)
    missing = [d for d in batch if d.row_id not in {m.id for m in claim.messages}]
    if missing:
        raise AssertionError(missing_rows_message(missing))
    if publish:
        report = publish_claimed(app, claim, using=using)
        if report.failed:
            raise AssertionError(publish_failed_message(report.failed, by_row))
        for dispatch in batch:
            dispatch.drained = Drained.PUBLISHED
        return
    for message in claim.messages:
        by_row[message.id].drained = Drained.RAN
        run_claimed(app, claim, message, using=using)
