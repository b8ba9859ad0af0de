"""The health check: is the outbox publishing? For probes, alerts and ``outbox health``.

:func:`check` returns the reasons an app's outbox is unhealthy, one line each (none:
healthy). Each database the sweep covers is read with a few bounded, indexed queries
(:class:`~celery_outbox.store.base.MonitoredStore`), ages on the database's clock::

    from datetime import timedelta
    from celery_outbox.health import check

    reasons = check(app, max_pending_age=timedelta(minutes=1))
    if reasons:
        print("\\n".join(reasons)); raise SystemExit(1)

A store that cannot be read is a reason (its error), never an exception.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import timedelta

from celery import Celery

from celery_outbox.config import OutboxConfig
from celery_outbox.exceptions import StoreError
from celery_outbox.registry import store_for
from celery_outbox.store.base import Backlog, LastSweep, OutboxStore

#: Default ``max_sweep_age``, in sweep intervals: a sweep records itself at most once an
#: interval, so a record up to two intervals old is normal.
SWEEP_INTERVALS = 3


@dataclass(frozen=True, kw_only=True)
class HealthLimits:
    """What :func:`check` tolerates.

    ``max_pending_age``: the longest a due row may wait; ``max_sweep_age``: the longest
    since the last recorded sweep; ``fail_on_failed``: whether any ``failed`` row is
    unhealthy.
    """

    max_pending_age: timedelta
    max_sweep_age: timedelta
    fail_on_failed: bool = False

    def __post_init__(self) -> None:
        for name in ("max_pending_age", "max_sweep_age"):
            value = getattr(self, name)
            if not isinstance(value, timedelta) or value <= timedelta(0):
                raise ValueError(f"{name}={value!r} is not accepted: give a positive timedelta.")

    @classmethod
    def defaults(cls, config: OutboxConfig) -> HealthLimits:
        """A due row may wait ``outbox_publish_grace`` plus three sweep intervals, and the
        last sweep be three intervals old.
        """
        interval = config.sweep_interval
        return cls(
            max_pending_age=config.publish_grace + SWEEP_INTERVALS * interval,
            max_sweep_age=SWEEP_INTERVALS * interval,
        )


def check(
    app: Celery,
    *,
    max_pending_age: timedelta | None = None,
    max_sweep_age: timedelta | None = None,
    fail_on_failed: bool = False,
    aliases: Sequence[str | None] | None = None,
) -> list[str]:
    """Why ``app``'s outbox is unhealthy, one line per reason; empty when healthy.

    Parameters
    ----------
    app
        The Celery app whose store is read.
    max_pending_age
        The longest the oldest due row may wait (default: ``outbox_publish_grace`` plus
        three ``outbox_sweep_interval``).
    max_sweep_age
        The longest since the last sweep (default: three ``outbox_sweep_interval``).
        Not checked on a store that keeps no sweep record.
    fail_on_failed
        Whether ``failed`` rows (publishing gave up) are a reason.
    aliases
        The databases to read (default: every database the sweep covers).

    Raises
    ------
    ValueError
        A limit that is not a positive ``timedelta``.
    NoStoreConfigured
        When ``app`` has no outbox store.
    """
    defaults = HealthLimits.defaults(OutboxConfig.from_celery(app))
    limits = HealthLimits(
        max_pending_age=defaults.max_pending_age if max_pending_age is None else max_pending_age,
        max_sweep_age=defaults.max_sweep_age if max_sweep_age is None else max_sweep_age,
        fail_on_failed=fail_on_failed,
    )
    store = store_for(app)
    reasons: list[str] = []
    for alias in store.sweep_aliases() if aliases is None else aliases:
        prefix = "" if alias is None else f"database {alias}: "
        reasons += [prefix + reason for reason in database_reasons(store, limits, using=alias)]
    return reasons


def database_reasons(
    store: OutboxStore, limits: HealthLimits, *, using: str | None = None
) -> list[str]:
    """The reasons database ``using`` of ``store`` is unhealthy under ``limits``."""
    try:
        backlog = store.backlog(using=using)
        reasons = _pending_reasons(backlog, limits)
        if store.keeps_sweeps():
            reasons += _sweep_reasons(store.last_sweep(using=using), limits)
    except StoreError as exc:  # one line, whatever the driver's message spans
        return ["cannot read the outbox: " + " ".join(str(exc).split())]
    if limits.fail_on_failed and backlog.failed:
        reasons.append(
            f"{backlog.failed} failed outbox row(s): publishing gave up (read last_error, "
            "fix, then reset them)"
        )
    return reasons


def _pending_reasons(backlog: Backlog, limits: HealthLimits) -> list[str]:
    age = backlog.oldest_due_age
    if age is None or age <= limits.max_pending_age:
        return []
    return [
        f"the oldest due outbox row has waited {_seconds(age)}, longer than "
        f"max pending age {_seconds(limits.max_pending_age)}: is the sweep (beat or the "
        "relay) running, and the broker reachable?"
    ]


def _sweep_reasons(last: LastSweep | None, limits: HealthLimits) -> list[str]:
    if last is None:
        return ["no sweep has run yet: is celery beat (or `outbox relay`) running?"]
    if last.age <= limits.max_sweep_age:
        return []
    return [
        f"the last sweep ran {_seconds(last.age)} ago, longer than max sweep age "
        f"{_seconds(limits.max_sweep_age)}: is celery beat (or `outbox relay`) running, "
        "and a worker consuming the sweep task?"
    ]


def _seconds(age: timedelta) -> str:
    return f"{age.total_seconds():.1f} s"
