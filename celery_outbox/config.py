"""The ``outbox_*`` settings, read once from a Celery app into a frozen value object."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from celery import Celery

from celery_outbox.exceptions import OutboxConfigError
from celery_outbox.rules import SHORTEST, Count, DottedPath, Flag, QueueName, Rule, Seconds
from celery_outbox.state import state_of

#: Seconds in an hour and in a day (for the ranges below).
HOUR = 3600.0
DAY = 24 * HOUR

#: The settings' defaults, in the units DESIGN.md gives (seconds for durations).
DEFAULTS: Mapping[str, Any] = {
    "outbox_store": None,
    "outbox_sweep_interval": 5.0,
    "outbox_sweep_batch_size": 500,
    "outbox_sweep_batch_bytes": 16 * 1024 * 1024,
    "outbox_publish_grace": 10.0,
    "outbox_claim_lease": 60.0,
    "outbox_publish_max_attempts": 20,
    "outbox_keep_published": 0.0,
    "outbox_park_after": 30.0,
    "outbox_max_deliveries": 5,
    "outbox_beat_schedule": True,
    "outbox_max_payload_bytes": 4 * 1024 * 1024,
    "outbox_retry_queue": None,
    "outbox_publish_timeout": 1.0,
    "outbox_keep_completed": 7 * 24 * 3600.0,
    "outbox_chord_max_header": 1000,
    "outbox_store_requeues": 60,
}


#: The accepted range of each setting (``docs/settings.md`` shows the same text). A new
#: setting gets its rule here, beside its default.
RULES: Mapping[str, Rule] = {
    "outbox_store": DottedPath(example="proj.outbox.make_store"),
    # Below 0.1 s beat would send sweeps faster than one can run.
    "outbox_sweep_interval": Seconds(minimum=0.1, maximum=DAY),
    "outbox_sweep_batch_size": Count(minimum=1, maximum=10_000, unit="rows"),
    # Below 64 KiB a claim would be one row of any real size; above 4 GiB bounds nothing.
    "outbox_sweep_batch_bytes": Count(minimum=64 * 1024, maximum=4 * 1024**3, unit="bytes"),
    "outbox_publish_grace": Seconds(minimum=SHORTEST, maximum=HOUR, zero=True),
    "outbox_claim_lease": Seconds(minimum=1.0, maximum=DAY),
    "outbox_publish_max_attempts": Count(minimum=1, maximum=10_000, unit="attempts"),
    "outbox_keep_published": Seconds(minimum=SHORTEST, maximum=3650 * DAY, zero=True),
    "outbox_park_after": Seconds(minimum=SHORTEST, maximum=DAY, zero=True),
    "outbox_max_deliveries": Count(minimum=1, maximum=1000, unit="deliveries"),
    "outbox_beat_schedule": Flag(),
    "outbox_max_payload_bytes": Count(minimum=1, maximum=1024**3, unit="bytes", none=True),
    # None: a retry goes back to the queue its task came from.
    "outbox_retry_queue": QueueName(),
    "outbox_publish_timeout": Seconds(minimum=0.01, maximum=300.0),
    # Put-backs of one message while its store fails, before it is held (60: about an hour).
    "outbox_store_requeues": Count(minimum=1, maximum=10_000, unit="put-backs"),
    # A duplicate arriving after this window runs again: keep it longer than any redelivery.
    "outbox_keep_completed": Seconds(minimum=1.0, maximum=3650 * DAY),
    # Every header step locks the join row once: past this, split the chord.
    "outbox_chord_max_header": Count(minimum=1, maximum=100_000, unit="steps", none=True),
}


def setting_errors(conf: Mapping[str, Any]) -> dict[str, str]:
    """Every setting of ``conf`` that is not accepted, mapped to its error message.

    Missing settings take their defaults (which are always accepted).
    """
    errors: dict[str, str] = {}
    for key, rule in RULES.items():
        try:
            rule.parse(key, conf.get(key, DEFAULTS[key]))
        except OutboxConfigError as exc:
            errors[key] = str(exc)
    return errors


@dataclass(frozen=True, kw_only=True)
class OutboxConfig:
    """Every ``outbox_*`` setting, validated and in Python units.

    Build it with :meth:`from_celery` (or :meth:`from_mapping`); durations are
    :class:`~datetime.timedelta`, settings stay in seconds.
    """

    store: str | None
    sweep_interval: timedelta
    sweep_batch_size: int
    #: Payload bytes one claim may hold: a batch stops at the row that reaches it
    #: (always at least one row), so memory is bounded by bytes, not only by rows.
    sweep_batch_bytes: int
    publish_grace: timedelta
    claim_lease: timedelta
    publish_max_attempts: int
    keep_published: timedelta
    park_after: timedelta
    max_deliveries: int
    beat_schedule: bool
    max_payload_bytes: int | None
    #: The queue of every retry of a task without its own ``retry_queue`` (``None``: the
    #: queue the task came from).
    retry_queue: str | None
    #: Seconds one publish may wait for the broker before the row is left to the sweeper.
    publish_timeout: timedelta
    #: How long ``CompletedTask`` rows of atomic tasks are kept (the duplicate window).
    keep_completed: timedelta
    #: Header steps a chord joined in the database may have (``None``: no limit).
    chord_max_header: int | None
    #: Put-backs of one message while its store fails (each after a backoff); the next
    #: failure holds it on its holding queue (:mod:`celery_outbox.worker.republish`).
    store_requeues: int

    @classmethod
    def from_mapping(cls, conf: Mapping[str, Any]) -> OutboxConfig:
        """Validate the ``outbox_*`` keys of ``conf``, using defaults for missing ones.

        Raises
        ------
        OutboxConfigError
            Naming every setting whose value is not accepted, with its range.
        """
        errors = setting_errors(conf)
        if errors:
            raise OutboxConfigError(" ".join(errors.values()))
        values = {
            key.removeprefix("outbox_"): rule.parse(key, conf.get(key, DEFAULTS[key]))
            for key, rule in RULES.items()
        }
        return cls(**values)

    @classmethod
    def from_celery(cls, app: Celery) -> OutboxConfig:
        """Read and validate the settings of a Celery app (once; see :mod:`celery_outbox.state`)."""
        state = state_of(app)
        if not isinstance(state.config, cls):
            conf = {key: app.conf.get(key, DEFAULTS[key]) for key in DEFAULTS}
            state.config = cls.from_mapping(conf)
        return state.config

    @classmethod
    def at_run_time(cls, app: Celery) -> OutboxConfig:
        """The settings of ``app``, or the defaults while they are not accepted (changed to
        a bad value and read again in a running worker): for the worker's failure paths,
        which must not fail on a setting (the bad value is reported where it is read)."""
        try:
            return cls.from_celery(app)
        except OutboxConfigError:
            return cls.from_mapping(DEFAULTS)
