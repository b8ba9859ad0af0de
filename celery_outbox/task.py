"""``OutboxTask``: a Celery task whose dispatch goes through the transactional outbox."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from celery import Celery, Task, bootsteps
from celery.exceptions import Retry
from celery.result import AsyncResult
from kombu.utils.uuid import uuid

from celery_outbox.config import OutboxConfig
from celery_outbox.dispatch import asynchronous
from celery_outbox.dispatch.batching import current_batch
from celery_outbox.dispatch.eager import apply_on_commit
from celery_outbox.dispatch.envelope import build_call
from celery_outbox.dispatch.target import dispatch_alias, is_atomic
from celery_outbox.exceptions import AtomicUnsupported, OutboxConfigError
from celery_outbox.registry import store_for
from celery_outbox.relay.relay import relay_for
from celery_outbox.signals import announce_dispatch
from celery_outbox.store.records import StoredMessage
from celery_outbox.store.superseding import superseding
from celery_outbox.worker import atomic as atomic_runs
from celery_outbox.worker import letters as unknown
from celery_outbox.worker import runner
from celery_outbox.worker import runner as retry_frames
from celery_outbox.worker.arguments import check_arguments
from celery_outbox.worker.attempt import USING_HEADER, attempt_from_request
from celery_outbox.worker.options import check_tasks, checked_options
from celery_outbox.worker.steps import Step
from celery_outbox.workflows import dispatch as workflow_dispatch

if TYPE_CHECKING:
    _TaskBase = Task[Any, Any]
else:  # Celery < 5.5 has no Task.__class_getitem__: subscript only for the type checker
    _TaskBase = Task


class OutboxTask(_TaskBase):
    """A Celery task that is dispatched through the outbox and retries without sleeping.

    ``delay``/``apply_async`` write an outbox row in the caller's current database
    transaction and publish it right after COMMIT; a rollback leaves neither row nor
    message, and a row that could not be published is published by the sweep task.
    Extra keyword to ``apply_async``: ``using`` (the database alias, Django); inside
    an atomic task's body it defaults to that task's database.
    """

    #: Acknowledge after the task ran, so a worker that dies mid-task redelivers it.
    acks_late = True
    #: Requeue a message whose worker process was lost (deliveries are counted).
    reject_on_worker_lost = True
    #: Exceptions that retry (Celery's name). Anything else is a dead letter at once.
    autoretry_for: tuple[type[BaseException], ...] = (Exception,)
    #: Exceptions that never retry, even when they match ``autoretry_for``.
    dont_autoretry_for: tuple[type[BaseException], ...] = ()
    #: Retries before the task becomes a dead letter (``None``: no limit).
    max_retries: int | None = 5
    #: Seconds: base of the random windows (0-1, 1-2, 2-4 ... x base); Celery's True: 1 s.
    retry_backoff: float | bool = 1.0
    #: ``False``: wait the top of each window instead of a random time within it.
    retry_jitter: bool = True
    #: Seconds: the cap of any one wait.
    retry_backoff_max: float = 300.0
    #: Seconds after the first failure when retrying stops (``None``: no deadline).
    retry_max_elapsed: float | None = None
    #: Queue of every retry (ETA or parked), so failing tasks cannot delay fresh work
    #: (``None``: the setting ``outbox_retry_queue``, else the task's own queue).
    retry_queue: str | None = None
    #: Exactly-once effects in the database: the body, its dispatches and a
    #: ``CompletedTask`` row commit in one transaction; a duplicate delivery is skipped.
    atomic: bool = False
    #: Database alias of an atomic task dispatched without ``using=`` (``None``: default).
    atomic_using: str | None = None
    #: Celery wraps ``run`` for autoretry unless this attribute exists; OutboxTask
    #: retries in ``__call__`` instead (windows, parking, dead letters), never in ``run``.
    _orig_run = None
    #: Random source of the retry windows (replace it in tests for determinism).
    rng = random.Random()

    @classmethod
    def on_bound(cls, app: Any) -> None:
        """Have ``app``'s workers check every outbox task's options when they start."""
        super().on_bound(app)
        app.steps["worker"].add(TaskOptionsCheck)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        """Run the task; on failure retry without sleeping, or write a dead letter."""
        request = self.request_stack.top
        if request is None:  # called directly, like a function
            return super().__call__(*args, **kwargs)
        if request.is_eager:
            return self.run(*args, **kwargs)
        attempt = attempt_from_request(self, request)
        step = Step.of(self, request, attempt)

        def call() -> Any:
            check_arguments(self, attempt.task_id, args, kwargs)
            return self.run(*args, **kwargs)

        if not is_atomic(self):
            value = runner.run_attempt(self, attempt, call, rng=self.rng)
            step.finished()
            return value
        body = call

        def committing(value: Any, result: str | None) -> None:  # join, successors, count
            step.committing(value, result, durable=_is_outbox_task)

        def atomic_call() -> Any:
            return atomic_runs.run_once(self, attempt, body, then=committing, root_id=step.root)

        return runner.run_attempt(self, attempt, atomic_call, rng=self.rng)

    def retry(
        self,
        args: Any = None,
        kwargs: Any = None,
        exc: Exception | None = None,
        throw: bool = True,
        eta: datetime | None = None,
        countdown: float | None = None,
        max_retries: int | None = None,
        **options: Any,
    ) -> Retry:
        """Retry the running task on its backoff window (or ``countdown``/``eta``).

        Celery's signature: ``args``/``kwargs`` replace the next attempt's arguments
        (merged as Celery merges them), ``options`` are ``apply_async`` options of the
        retried message (``queue``, ``priority``, ``headers`` ...). ``exc`` defaults to
        the error being handled, if any. Exhausted retries write a dead letter, with the
        failed attempt's arguments, and raise ``exc`` (or :class:`RetriesExhausted`).
        """
        request = self.request
        if request.called_directly or request.is_eager:
            return super().retry(args, kwargs, exc, throw, eta, countdown, max_retries, **options)
        attempt = runner.running_attempt()
        if attempt is None or attempt.task_id != request.id:
            attempt = attempt_from_request(self, request)
        raise runner.retry(
            self,
            attempt,
            exc if exc is not None else runner.handled_error(),
            rng=self.rng,
            args=args,
            kwargs=kwargs,
            countdown=countdown,
            eta=eta,
            max_retries=max_retries,
            overrides=options,
        )

    def apply_async(
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
    ) -> AsyncResult[Any]:
        """Write the task's outbox row in the current transaction; publish on commit.

        Accepts Celery's ``apply_async`` options (``countdown``, ``eta``, ``expires``,
        ``queue``, ``routing_key``, ``priority``, ``headers`` ...). ``task_id`` is an
        idempotency key: while a row with that id is pending, no second row is written,
        unless that row's message was already delivered (Celery's ``Task.replace()``, a
        task dispatching its own id: :mod:`celery_outbox.store.superseding`).
        Returns the ``AsyncResult`` Celery builds (``ignored`` with ``ignore_result``).
        ``producer`` is ignored: the relay publishes through its own connection.

        Raises
        ------
        PayloadError
            When the arguments cannot be serialised, are nested deeper than
            ``MAX_ARGUMENT_DEPTH``, or the row (arguments, headers, options, task id)
            cannot be stored or exceeds ``outbox_max_payload_bytes``
            (see :mod:`celery_outbox.dispatch.validation`).
        NoStoreConfigured
            When no outbox store is installed.
        OutboxConfigError
            When the task's retry options are not accepted (checked once per task class).
        """
        app = self.app
        config = OutboxConfig.from_celery(app)
        checked_options(self)
        using = dispatch_alias(using)
        atomic_runs.check_atomic(self, using)
        task_id = task_id or uuid()
        given = dict(options, link=link, link_error=link_error, shadow=shadow)
        options = dict(given)
        if using is not None:  # an atomic task runs in the database it was dispatched with
            options["headers"] = {**(options.get("headers") or {}), USING_HEADER: using}
        workflow_dispatch.mark_join(options)
        if app.conf.task_always_eager:
            eager = apply_on_commit(self, args, kwargs, task_id, options, using, config)
            announce_dispatch(
                self, task_id, args, kwargs, given, using=using, message=None, row_id=None
            )
            return eager
        store = store_for(app)
        now = store.now(using=using)  # the database's clock, whatever this host's says
        call = build_call(
            self,
            args,
            kwargs,
            task_id=task_id,
            options=options,
            now=now,
            park_after=config.park_after,
            max_bytes=config.max_payload_bytes,
            lease=config.publish_grace,  # the on-commit publisher's, so it needs no claim
        )
        message = call.message
        running = runner.running_attempt()
        supersedes = superseding(
            message, running_task_id=None if running is None else running.task_id
        )
        batch = current_batch()
        if batch is None and workflow_dispatch.hand_on(
            self, message, relay_for(app).publisher, supersedes, store=store, using=using
        ):
            return call.result  # a step's successor, written with the step's last writes

        def written(row_id: int | None) -> None:  # announce, count and publish the row
            announce_dispatch(
                self, task_id, args, kwargs, given, using=using, message=message, row_id=row_id
            )
            if row_id is not None:
                workflow_dispatch.count_dispatch(
                    self, task_id, options, store=store, using=using, is_step_task=_is_outbox_task
                )
            if row_id is not None and message.locked_until is not None:
                publisher = relay_for(app).publisher(using)
                store.defer_publish(StoredMessage.written(message, row_id), publisher, using=using)

        if (
            supersedes is not None
            or batch is None
            or not batch.collect(store, message, using, written)
        ):
            written(store.add(message, using=using, supersedes=supersedes))
        return call.result

    async def aapply_async(
        self,
        args: Sequence[Any] | None = None,
        kwargs: Mapping[str, Any] | None = None,
        **options: Any,
    ) -> AsyncResult[Any]:
        """:meth:`apply_async` for ``async def`` code: the same row, options and result;
        the event loop never waits on the database or the broker (docs/async.md).
        """
        result: AsyncResult[Any] = await asynchronous.aapply_async(self, args, kwargs, **options)
        return result

    async def adelay(self, *args: Any, **kwargs: Any) -> AsyncResult[Any]:
        """:meth:`delay` for ``async def`` code (see :meth:`aapply_async`)."""
        return await self.aapply_async(args, kwargs)

    def delay_on_commit(self, *args: Any, **kwargs: Any) -> AsyncResult[Any]:
        """Same as :meth:`delay`: an outbox task is always published on commit, durably."""
        return self.apply_async(args, kwargs)

    def apply_async_on_commit(self, *args: Any, **kwargs: Any) -> AsyncResult[Any]:
        """Same as :meth:`apply_async`, durable (Celery's ``DjangoTask`` API)."""
        return self.apply_async(*args, **kwargs)


def _is_outbox_task(task: Task[Any, Any] | None) -> bool:
    return isinstance(task, OutboxTask)


workflow_dispatch.install(_is_outbox_task)
unknown.install()
retry_frames.install(_is_outbox_task)


def check_app(app: Celery) -> None:
    """Check the ``outbox_*`` settings of ``app``, then the options of every ``OutboxTask``
    of ``app`` (retry options, and whether an atomic task can run), reporting all bad ones.

    Raises
    ------
    OutboxConfigError
        One message listing each task whose options are not accepted; an
        :class:`AtomicUnsupported` when every problem is an atomic task its store or
        database cannot run.
    """
    tasks = [task for task in app.tasks.values() if isinstance(task, OutboxTask)]
    problems: list[str] = []
    try:
        check_tasks(app, tasks)
    except OutboxConfigError as exc:
        problems.append(str(exc))
    atomic_problems = []
    for task in tasks:
        try:
            atomic_runs.check_atomic(task)
        except AtomicUnsupported as exc:
            atomic_problems.append(str(exc))
    if problems:
        raise OutboxConfigError("\n".join(problems + atomic_problems))
    if atomic_problems:
        raise AtomicUnsupported("\n".join(atomic_problems))


class TaskOptionsCheck(bootsteps.Step):
    """Worker boot step: no start with bad ``OutboxTask`` options (rather than lost messages)."""

    def __init__(self, parent: Any, **kwargs: Any) -> None:
        check_app(parent.app)
        super().__init__(parent, **kwargs)
