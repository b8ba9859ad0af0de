"""``OutboxTask``: a Celery task whose dispatch goes through the transactional outbox."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from functools import partial
from typing import Any

from celery import Task
from celery.result import AsyncResult
from kombu.utils.uuid import uuid

from celery_outbox.clock import utcnow
from celery_outbox.config import OutboxConfig
from celery_outbox.envelope import build_message, serialise_body
from celery_outbox.registry import relay_for, store_for


class OutboxTask(Task):  # type: ignore[misc]
    """A Celery task that is dispatched through the outbox and retries without sleeping.

    ``delay``/``apply_async`` write an outbox row in the caller's current database
    transaction and publish it right after COMMIT; a rollback leaves neither row nor
    message, and a row that could not be published is published by the sweep task.
    Extra keyword to ``apply_async``: ``using`` (the database alias, Django).
    """

    #: Acknowledge after the task ran, so a worker that dies mid-task redelivers it.
    acks_late = True
    #: Requeue a message whose worker process was lost (deliveries are counted).
    reject_on_worker_lost = True

    def apply_async(  # type: ignore[override]
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        task_id: str | None = None,
        producer: Any = None,
        link: Any = None,
        link_error: Any = None,
        shadow: str | None = None,
        *,
        using: str | None = None,
        **options: Any,
    ) -> AsyncResult:
        """Write the task's outbox row in the current transaction; publish on commit.

        Accepts Celery's ``apply_async`` options (``countdown``, ``eta``, ``expires``,
        ``queue``, ``routing_key``, ``priority``, ``headers`` ...). ``task_id`` is an
        idempotency key: while a row with that id is pending, no second row is written.
        ``producer`` is ignored: the relay publishes through its own connection.

        Raises
        ------
        PayloadError
            When the arguments cannot be serialised or exceed ``outbox_max_payload_bytes``.
        NoStoreConfigured
            When no outbox store is installed.
        """
        app = self._get_app()
        config = OutboxConfig.from_celery(app)
        task_id = task_id or uuid()
        options = dict(options, link=link, link_error=link_error, shadow=shadow)
        if app.conf.task_always_eager:
            return self._apply_on_commit(args, kwargs, task_id, options, using, config)
        now = utcnow()
        message = build_message(self, args, kwargs, task_id=task_id, options=options, now=now,
                                park_after=config.park_after, max_bytes=config.max_payload_bytes)
        store = store_for(app)
        row_id = store.add(message, using=using)
        if row_id is not None and message.available_at <= now:
            store.defer_publish(row_id, partial(relay_for(app).publish_ids, using=using),
                                using=using)
        return self.AsyncResult(message.task_id)

    def delay_on_commit(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """Same as :meth:`delay`: an outbox task is always published on commit, durably."""
        return self.apply_async(args, kwargs)

    def apply_async_on_commit(self, *args: Any, **kwargs: Any) -> AsyncResult:
        """Same as :meth:`apply_async`, durable (Celery's ``DjangoTask`` API)."""
        return self.apply_async(*args, **kwargs)

    def _apply_on_commit(self, args: Sequence[Any] | None, kwargs: Mapping[str, Any] | None,
                         task_id: str, options: dict[str, Any], using: str | None,
                         config: OutboxConfig) -> AsyncResult:
        # Eager mode (user test suites): validate the arguments now, run on commit.
        serialise_body(self.name, (list(args or ()), dict(kwargs or {}), {}),
                       serializer=options.get("serializer") or self.serializer
                       or self._get_app().conf.task_serializer,
                       compression=None, max_bytes=config.max_payload_bytes)
        outcome: list[AsyncResult] = []

        def run() -> None:
            outcome.append(Task.apply_async(self, args, kwargs, task_id=task_id, **options))

        store_for(self._get_app()).on_commit(run, using=using)
        return outcome[0] if outcome else self.AsyncResult(task_id)
