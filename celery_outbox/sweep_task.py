"""The ``celery_outbox.sweep`` task and its beat entry, registered with every Celery app.

Importing :mod:`celery_outbox` connects :func:`install_sweep` to Celery's app
finalisation (as Celery's own ``celery.backend_cleanup`` is), so ``celery worker`` and
``celery beat`` of any app know the task, and beat runs it every
``outbox_sweep_interval`` unless ``outbox_beat_schedule`` is False. Beat schedulers
(Celery's ``PersistentScheduler`` and django-celery-beat's ``DatabaseScheduler``) read
``app.conf.beat_schedule`` after the app is finalised, so the entry is there in time.
"""

from __future__ import annotations

from typing import Any

from celery import Celery, Task
from celery import _state as celery_state
from celery._state import connect_on_app_finalize

from celery_outbox.config import OutboxConfig
from celery_outbox.registry import relay_for, store_for
from celery_outbox.sweeper import Sweeper, SweepReport

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


@connect_on_app_finalize
def install_sweep(app: Celery) -> Task[Any, Any]:
    """Register the sweep task with ``app`` and add its beat entry (on finalisation)."""

    def sweep() -> dict[str, int | bool]:
        """Publish the outbox rows their on-commit publisher left behind."""
        return sweep_app(app).as_dict()

    task: Task[Any, Any] = app.task(name=SWEEP_TASK, shared=False, lazy=False, ignore_result=True)(
        sweep
    )
    add_beat_entry(app)
    return task


def _install_on_finalized_apps() -> None:
    # Apps finalised before celery_outbox was imported missed the finalize callback.
    for app in list(celery_state._get_active_apps()):  # type: ignore[attr-defined]
        if app.finalized and SWEEP_TASK not in app.tasks:
            install_sweep(app)


_install_on_finalized_apps()
