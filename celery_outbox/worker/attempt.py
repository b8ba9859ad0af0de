"""One attempt of an outbox task, as a typed value built once from Celery's request."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import Any

from celery import Task

from celery_outbox import tracing
from celery_outbox._compat import delivered_headers
from celery_outbox.dead_letters import ROUTING_KEYS
from celery_outbox.exceptions import OutboxConfigError

#: Message header carrying the time of a task's first failure across its retries.
FIRST_FAILED_HEADER = "outbox_first_failed_at"
#: Message header counting how often a message was put back because the store failed.
REQUEUES_HEADER = "outbox_requeues"
#: Message header of a message put back because its dead letter could not be written:
#: the letter's failure (JSON), written by the next delivery without running the body.
PENDING_LETTER_HEADER = "outbox_pending_letter"
#: Message header of a message held because its store kept failing (put back
#: ``outbox_store_requeues`` times): where it came from (JSON of :meth:`Attempt.routing`).
#: Delivered from its holding queue, it is sent on as if delivered from there.
HELD_HEADER = "outbox_held"
#: Message header naming the database alias a task was dispatched with (``using=``).
USING_HEADER = "outbox_using"
#: Message header of a retry sent to a retry queue: where the task came from (JSON of
#: :meth:`Attempt.routing`), so its dead letter is requeued there, not to the retries.
HOME_HEADER = "outbox_home"
#: ``apply_async`` options of the request that a message sent again sets anew.
_RESENT_ANEW = ("task_id", "eta", "countdown", "retries")


@dataclass(frozen=True, kw_only=True)
class Attempt:
    """One delivery of an outbox task to a worker: what ran, and how to send it again.

    ``options`` are the ``apply_async`` options that send this message again (routing,
    headers, links, limits), without its task id, ETA and retry count.
    ``first_failed_at`` is ``None`` until the task failed once. ``using`` is the
    database alias the task was dispatched with, ``None`` for the store's default.
    ``trace`` is the trace context the message was delivered with (its headers, empty
    without OpenTelemetry or a traced dispatch: :mod:`celery_outbox.tracing`).
    ``home`` is where the task came from when this delivery is a retry on a retry queue
    (``None``: it came from where it was delivered from), or where it was held from
    (:data:`HELD_HEADER`: its ``options`` then send it there, not back to the holding
    queue). ``pending_letter`` is the failure of a run whose dead letter could not be
    written (:data:`PENDING_LETTER_HEADER`).
    """

    task_name: str
    task_id: str
    args: tuple[Any, ...] = ()
    kwargs: Mapping[str, Any] = field(default_factory=dict)
    retries: int = 0
    first_failed_at: datetime | None = None
    requeues: int = 0
    delivery_info: Mapping[str, Any] = field(default_factory=dict)
    options: Mapping[str, Any] = field(default_factory=dict)
    using: str | None = None
    trace: Mapping[str, str] = field(default_factory=dict)
    home: Mapping[str, Any] | None = None
    pending_letter: Mapping[str, Any] | None = None

    @property
    def redelivered(self) -> bool:
        """Whether the broker delivered this message before (its worker may have died)."""
        return bool(self.delivery_info.get("redelivered"))

    def routing(self) -> dict[str, Any]:
        """Where the task came from (before any retry queue), as a dead letter keeps it
        for a requeue.
        """
        if self.home is not None:
            return dict(self.home)
        info = self.delivery_info
        anonymous = info.get("exchange") in ("", None)
        return {
            "queue": info.get("routing_key") if anonymous else None,
            "exchange": None if anonymous else info.get("exchange"),
            "routing_key": None if anonymous else info.get("routing_key"),
            "priority": info.get("priority"),
        }

    def resend_options(
        self,
        *,
        eta: datetime | None,
        retries: int,
        headers: Mapping[str, Any],
        overrides: Mapping[str, Any] | None = None,
    ) -> dict[str, Any]:
        """``apply_async`` options sending this message again at ``eta`` (``None``: now).

        ``overrides`` are ``retry(**options)``; a ``queue`` among them replaces the
        delivered exchange and routing key, as in Celery.
        """
        options = dict(self.options)
        extra = dict(overrides or {})
        if extra.get("queue"):
            options.pop("exchange", None)
            options.pop("routing_key", None)
        options.update(extra)
        # The delivered trace context, unless a span current at the resend replaces it.
        merged = {**self.trace, **(options.get("headers") or {}), **headers}
        return {**options, "headers": merged, "eta": eta, "retries": retries}

    def with_arguments(self, args: Any, kwargs: Any, *, run: Callable[..., Any]) -> Attempt:
        """This attempt with ``retry(args=..., kwargs=...)`` applied, merged as Celery does.

        Only ``args`` given: inherited keyword arguments the new positional ones cover
        are dropped; only ``kwargs`` given: they may replace inherited positional ones.

        Raises
        ------
        OutboxConfigError
            Naming ``args`` or ``kwargs`` when not a list/tuple or a dict with text keys.
        """
        if args is None and kwargs is None:
            return self
        _check_arguments(args, kwargs)
        if args is not None and kwargs is None and self.kwargs:
            args, kwargs = _new_positionals(run, args, self.kwargs)
        elif kwargs is not None and args is None and self.args:
            args, kwargs = _new_keywords(run, self.args, kwargs)
        return replace(
            self,
            args=tuple(self.args if args is None else args),
            kwargs=dict(self.kwargs if kwargs is None else kwargs),
        )


def attempt_from_request(task: Task[Any, Any], request: Any) -> Attempt:
    """The :class:`Attempt` of ``task``'s running ``request`` (Celery's ``Context``).

    The one place that reads Celery's request object.
    """
    signature = task.signature_from_request(request)
    options = {k: v for k, v in signature.options.items() if k not in _RESENT_ANEW}
    held = _home(getattr(request, HELD_HEADER, None))
    if held is not None:  # delivered from its holding queue: send it on from where it was
        options = _routed_to(options, held)
    return Attempt(
        task_name=task.name,
        task_id=request.id,
        args=tuple(request.args or ()),
        kwargs=dict(request.kwargs or {}),
        retries=request.retries or 0,
        first_failed_at=_first_failed_at(getattr(request, FIRST_FAILED_HEADER, None)),
        requeues=int(getattr(request, REQUEUES_HEADER, 0) or 0),
        delivery_info=dict(request.delivery_info or {}),
        options=options,
        using=_text(getattr(request, USING_HEADER, None)),
        trace=delivered_headers(request, tracing.fields()),
        home=held or _home(getattr(request, HOME_HEADER, None)),
        pending_letter=_pending_letter(getattr(request, PENDING_LETTER_HEADER, None)),
    )


def _routed_to(options: Mapping[str, Any], routing: Mapping[str, Any]) -> dict[str, Any]:
    """``options`` sending a message where ``routing`` (:meth:`Attempt.routing`) says."""
    routed = {k: v for k, v in options.items() if k not in ("queue", "exchange", "routing_key")}
    if routing.get("queue"):
        routed["queue"] = routing["queue"]
    else:
        routed.update(exchange=routing.get("exchange"), routing_key=routing.get("routing_key"))
    if routing.get("priority") is not None:
        routed["priority"] = routing["priority"]
    return routed


def _pending_letter(value: Any) -> dict[str, Any] | None:
    """The failure in a :data:`PENDING_LETTER_HEADER`; ``None`` for none, or one this
    library did not write.
    """
    try:
        found = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return None
    if not isinstance(found, dict) or not isinstance(found.get("exception_type"), str):
        return None
    return found


def _text(value: Any) -> str | None:
    return value if isinstance(value, str) and value else None


def _home(value: Any) -> dict[str, Any] | None:
    """The routing in a :data:`HOME_HEADER`; ``None`` for one this library did not write."""
    try:
        home = json.loads(value) if isinstance(value, str) else None
    except ValueError:
        return None
    if not isinstance(home, dict) or set(home) != set(ROUTING_KEYS):
        return None
    return home


def _first_failed_at(value: Any) -> datetime | None:
    if not isinstance(value, str):
        return None
    try:
        return datetime.fromisoformat(value)
    except ValueError:  # not a header this library wrote: count from this failure
        return None


def _check_arguments(args: Any, kwargs: Any) -> None:
    problems = []
    if args is not None and not isinstance(args, (list, tuple)):
        problems.append(f"args={args!r} (give a list or tuple)")
    if kwargs is not None and not (
        isinstance(kwargs, Mapping) and all(isinstance(key, str) for key in kwargs)
    ):
        problems.append(f"kwargs={kwargs!r} (give a dict with text keys)")
    if problems:
        raise OutboxConfigError(f"retry() arguments not accepted: {', '.join(problems)}.")


def _signature(run: Callable[..., Any]) -> inspect.Signature | None:
    try:
        return inspect.signature(run)
    except (TypeError, ValueError):
        return None  # the task's own argument checks apply


def _new_positionals(
    run: Callable[..., Any], args: Sequence[Any], inherited: Mapping[str, Any]
) -> tuple[Sequence[Any], Mapping[str, Any] | None]:
    signature = _signature(run)
    if signature is None:
        return args, None
    positional = [
        p
        for p in signature.parameters.values()
        if p.kind in (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    ]
    kwargs = dict(inherited)
    for parameter in positional[: len(args)]:
        if parameter.kind == inspect.Parameter.POSITIONAL_OR_KEYWORD:
            kwargs.pop(parameter.name, None)
    return args, kwargs


def _new_keywords(
    run: Callable[..., Any], inherited: Sequence[Any], kwargs: Mapping[str, Any]
) -> tuple[Sequence[Any] | None, Mapping[str, Any]]:
    signature = _signature(run)
    if signature is None:
        return None, kwargs
    try:
        bound = signature.bind_partial(*inherited)
    except TypeError:
        return None, kwargs  # the task's own argument checks apply
    rest = dict(kwargs)
    for name in list(rest):
        if (
            name in bound.arguments
            and signature.parameters[name].kind == inspect.Parameter.POSITIONAL_OR_KEYWORD
        ):
            bound.arguments[name] = rest.pop(name)
    return bound.args, {**bound.kwargs, **rest}
