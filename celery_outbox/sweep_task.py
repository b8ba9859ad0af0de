"""The ``celery_outbox.sweep`` task and its beat entry, registered with apps using the outbox.

Importing :mod:`celery_outbox` connects to Celery's app finalisation (as Celery's own
``celery.backend_cleanup`` is), so ``celery worker`` and ``celery beat`` of an app that
uses the outbox know the task, and beat runs it every ``outbox_sweep_interval`` unless
``outbox_beat_schedule`` is False. An app uses the outbox (:func:`uses_outbox`) when it
has a store (installed, named by ``outbox_store``, or the process default store
``django_outbox`` sets) or registers an :class:`~celery_outbox.task.OutboxTask`; any other
app in the process gets neither the task nor the entry. Beat schedulers
(Celery's ``PersistentScheduler`` and django-celery-beat's ``DatabaseScheduler``) read
``app.conf.beat_schedule`` after the app is finalised, so the entry is there in time.
"""

from __future__ import annotations

from typing import Any

from celery import Celery, Task

from celery_outbox._compat import active_apps, connect_on_app_finalize, registered_tasks
from celery_outbox.config import OutboxConfig
from celery_outbox.registry import store_for
from celery_outbox.relay.relay import relay_for
from celery_outbox.relay.sweeper import Sweeper, SweepReport
from celery_outbox.state import default_store, state_of
from celery_outbox.task import OutboxTask

#: The registered name of the sweep task.
SWEEP_TASK = "celery_outbox.sweep"
#: The key of its entry in ``beat_schedule``.
BEAT_ENTRY = "celery-outbox-sweep"


def sweep_app(app: Celery) -> SweepReport:
    """Sweep every database alias of ``app``'s store once (what the task runs).

    Raises
    ------
    NoStoreConfigured
        When ``app`` has no outbox store.
    StoreError
        When the store fails.
    """
    relay = relay_for(app)
    sweeper = Sweeper(
        app=app, store=store_for(app), relay=relay, config=OutboxConfig.from_celery(app)
    )
    try:
        return sweeper.sweep_all()
    finally:
        # Between beat ticks an idle connection may be dropped by the broker: reconnect
        # once per sweep rather than fail the first publish of the next one.
        relay.close()


def add_beat_entry(app: Celery) -> None:
    """Add the ``celery-outbox-sweep`` entry to ``app.conf.beat_schedule``.

    Does nothing when ``outbox_beat_schedule`` is False, and keeps an entry of that
    name the user already defined.
    """
    config = OutboxConfig.from_celery(app)
    if not config.beat_schedule:
        return
    schedule: dict[str, Any] = dict(app.conf.beat_schedule or {})
    if BEAT_ENTRY in schedule:
        return
    interval = config.sweep_interval
    schedule[BEAT_ENTRY] = {
        "task": SWEEP_TASK,
        "schedule": interval,
        # A sweep not started within one interval is superseded by the next one.
        "options": {"expires": interval.total_seconds()},
    }
    app.conf.beat_schedule = schedule


def uses_outbox(app: Celery) -> bool:
    """Whether ``app`` has an outbox store or registers an ``OutboxTask``.

    Before ``app`` is finalised its pending task decorators are not counted.
    """
    if state_of(app).store is not None or default_store() is not None:
        return True
    if app.conf.get("outbox_store") is not None:
        return True
    return any(isinstance(task, OutboxTask) for task in registered_tasks(app).values())


def install_sweep(app: Celery) -> Task[Any, Any]:
    """Register the sweep task with ``app`` and add its beat entry."""
    existing = registered_tasks(app).get(SWEEP_TASK)
    if existing is not None:
        return existing

    def sweep() -> dict[str, int | bool]:
        """Publish the outbox rows their on-commit publisher left behind."""
        return sweep_app(app).as_dict()

    task: Task[Any, Any] = app.task(name=SWEEP_TASK, shared=False, lazy=False, ignore_result=True)(
        sweep
    )
    add_beat_entry(app)
    return task


@connect_on_app_finalize
def _on_app_finalize(app: Celery) -> None:
    # Runs before the app's pending task decorators are evaluated: an app with a store
    # gets the sweep now; one whose only sign is an OutboxTask is checked once they are.
    if uses_outbox(app):
        install_sweep(app)
        return

    def after_finalize(sender: Celery, **kwargs: Any) -> None:
        if sender is app and uses_outbox(app):
            install_sweep(app)

    app.on_after_finalize.connect(after_finalize, weak=False)


def _install_on_finalized_apps() -> None:
    # Apps finalised before celery_outbox was imported missed the finalize callback.
    for app in active_apps():
        if app.finalized and uses_outbox(app):  # type: ignore[attr-defined]
            install_sweep(app)


_install_on_finalized_apps()
