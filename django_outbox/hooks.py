"""Dispatch an ``OutboxTask`` when a model signal fires, in the same transaction.

``post_save`` runs inside the caller's ``atomic()`` block, so the outbox row commits or
rolls back together with the save::

    from django.db.models.signals import post_save
    from django_outbox.hooks import dispatch_on

    class ShopConfig(AppConfig):
        def ready(self):
            dispatch_on(post_save, sender=Order, task=send_push,
                        args=lambda order, created: (order.pk,),
                        when=lambda order, created: created)

Hooks are connected explicitly (nothing happens at import time); ``dispatch_on``
returns a :class:`DispatchHook` whose :meth:`~DispatchHook.disconnect` undoes it.

``args``, ``kwargs`` and ``when`` are called with the instance first, then with any of
the signal's keyword arguments they name as parameters (``created``, ``update_fields``,
``using`` ...). Fixture loading (``raw=True``) never dispatches. The row is written to
the database the instance was saved to, unless ``using`` names another.

See ``docs/hooks.md``.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from django.dispatch import Signal

from celery_outbox.task import OutboxTask

#: Called with the instance and the signal keyword arguments it names.
SignalCallable = Callable[..., Any]


class DispatchHook:
    """One task dispatched from one model signal (:func:`dispatch_on` builds and connects
    one); :meth:`connect` and :meth:`disconnect` it explicitly.
    """

    def __init__(
        self,
        signal: Signal,
        *,
        sender: type[Any],
        task: OutboxTask,
        args: SignalCallable | None = None,
        kwargs: SignalCallable | None = None,
        when: SignalCallable | None = None,
        using: str | None = None,
    ) -> None:
        self.signal = signal
        self.sender = sender
        self.task = task
        self.using = using
        self._args = _bind(args) if args is not None else None
        self._kwargs = _bind(kwargs) if kwargs is not None else None
        self._when = _bind(when) if when is not None else None

    @property
    def dispatch_uid(self) -> str:
        """The ``dispatch_uid`` this hook connects with (one per hook)."""
        return f"django_outbox.hooks.{id(self)}"

    def connect(self) -> DispatchHook:
        """Start dispatching on the signal (idempotent); returns the hook."""
        self.signal.connect(
            self.receive, sender=self.sender, weak=False, dispatch_uid=self.dispatch_uid
        )
        return self

    def disconnect(self) -> bool:
        """Stop dispatching; ``False`` when the hook was not connected."""
        return self.signal.disconnect(sender=self.sender, dispatch_uid=self.dispatch_uid)

    def receive(self, sender: Any, instance: Any = None, **signal_kwargs: Any) -> None:
        """The signal receiver: dispatch the task unless ``when`` says no."""
        if signal_kwargs.get("raw"):
            return
        if self._when is not None and not self._when(instance, signal_kwargs):
            return
        args = self._args(instance, signal_kwargs) if self._args is not None else ()
        kwargs = self._kwargs(instance, signal_kwargs) if self._kwargs is not None else {}
        self.dispatch(args, kwargs, using=self.using or signal_kwargs.get("using"))

    def dispatch(
        self, args: Sequence[Any], kwargs: Mapping[str, Any], *, using: str | None
    ) -> None:
        """Dispatch the task (an ``OutboxTask`` takes ``using``)."""
        self.task.apply_async(tuple(args), dict(kwargs), using=using)


def dispatch_on(
    signal: Signal,
    *,
    sender: type[Any],
    task: OutboxTask,
    args: SignalCallable | None = None,
    kwargs: SignalCallable | None = None,
    when: SignalCallable | None = None,
    using: str | None = None,
) -> DispatchHook:
    """Dispatch ``task`` whenever ``signal`` fires for ``sender``; connected at once.

    Parameters
    ----------
    signal
        A model signal such as ``post_save`` or ``post_delete``.
    sender
        The model class.
    task
        An ``OutboxTask``.
    args, kwargs
        Build the task's positional and keyword arguments from the instance.
    when
        Dispatch only when it returns a true value.
    using
        Database alias of the outbox row; default: the one the instance was saved to.

    Returns
    -------
    DispatchHook
        Call ``.disconnect()`` on it to stop.
    """
    return DispatchHook(
        signal, sender=sender, task=task, args=args, kwargs=kwargs, when=when, using=using
    ).connect()


def _bind(function: SignalCallable) -> Callable[[Any, Mapping[str, Any]], Any]:
    """Call ``function`` with the instance, then the signal kwargs its parameters name."""
    names = [
        p.name
        for p in list(inspect.signature(function).parameters.values())[1:]
        if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
    ]

    def call(instance: Any, signal_kwargs: Mapping[str, Any]) -> Any:
        missing = [name for name in names if name not in signal_kwargs]
        if missing:
            raise TypeError(
                f"{function!r} asks for {missing}, which this signal does not "
                f"send; it sends {sorted(signal_kwargs)}."
            )
        return function(instance, **{name: signal_kwargs[name] for name in names})

    return call
