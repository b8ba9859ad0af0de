"""Metrics of the outbox: Prometheus gauges read at scrape time, and counters.

The in-process counters of the outbox, fed by the library's signals.

Imported by :mod:`celery_outbox.metrics` (which checks that ``prometheus_client`` is
installed): the counters are registered in ``prometheus_client``'s default registry and
:func:`connect` hooks them to :mod:`celery_outbox.signals`. Until then the signals have
no receivers and sending them costs a check each.

Under a Celery prefork worker each child counts its own publishes, retries and dead
letters: run the worker with ``PROMETHEUS_MULTIPROC_DIR`` set (an empty directory, set
before ``prometheus_client`` is imported) and serve a registry holding a
``prometheus_client.multiprocess.MultiProcessCollector`` (docs/observability.md).

Labels are task names and entry points only, never task ids or arguments.

Prometheus metrics of the outbox (``pip install celery-outbox[prometheus]``).

Two kinds, as DESIGN.md lists them (docs/observability.md, "Metrics"):

* **Gauges read at scrape time** by :class:`OutboxCollector`, a ``prometheus_client``
  collector usable in any registry: the backlog, the dead letters and the workflows by
  status, and the last sweep, each a few bounded, indexed reads of the store
  (:class:`~celery_outbox.store.base.MonitoredStore`). Register it in one process only
  (the web process, or a sidecar), never in every worker: each scrape reads the database.
* **Counters counted in process** (:mod:`celery_outbox.metrics`): publishes by
  path, publish errors, the commit-to-broker latency, retries, dead letters and skipped
  duplicates. Importing this module registers them in ``prometheus_client``'s default
  registry and connects them to the library's signals; nothing counts before (the
  Django app imports it when ``prometheus_client`` is installed)::

    import celery_outbox.metrics  # in the module that creates the Celery app
    from prometheus_client import REGISTRY

    REGISTRY.register(celery_outbox.metrics.OutboxCollector(app))

A store that cannot be read during a scrape does not fail the scrape: the store's
gauges are left out, ``celery_outbox_scrape_error`` is 1 and the error is logged.
"""

from __future__ import annotations

try:
    from prometheus_client.core import GaugeMetricFamily
    from prometheus_client.registry import Collector
except ImportError as exc:  # the one guarded import: the extra is optional
    raise ImportError(
        "celery_outbox.metrics needs prometheus_client: pip install celery-outbox[prometheus]"
    ) from exc
import functools
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from celery import Celery
from prometheus_client import Counter, Histogram

from celery_outbox import signals
from celery_outbox.clock import utcnow
from celery_outbox.exceptions import StoreError
from celery_outbox.long_text import bounded_logger
from celery_outbox.registry import store_for
from celery_outbox.store.base import Backlog, OutboxStore
from celery_outbox.store.counts import SCRAPE_EXACT_UP_TO
from celery_outbox.store.records import StoredMessage

logger = bounded_logger(__name__)


__all__ = ["OutboxCollector", "Snapshot", "read_snapshot"]


# --- The in-process counters of the outbox, fed by the library's signals.

#: Upper bounds of the latency histogram's buckets, in seconds: an on-commit publish
#: takes milliseconds, a sweep up to a few intervals, a broker outage minutes to hours.
LATENCY_BUCKETS = (
    0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 120.0,
    300.0, 900.0, 3600.0,
)  # fmt: skip

PUBLISHED = Counter(
    "celery_outbox_published",
    "Outbox rows published, by entry point (commit, sweep, relay, now).",
    ["path"],
)

PUBLISH_ERRORS = Counter(
    "celery_outbox_publish_errors",
    "Outbox rows a publish pass left unpublished (rescheduled or failed for good).",
)

PUBLISH_LATENCY = Histogram(
    "celery_outbox_publish_latency_seconds",
    "From a row's commit (its due time; its creation once a publish failed) to the broker.",
    buckets=LATENCY_BUCKETS,
)

RETRIES = Counter(
    "celery_outbox_retries",
    "Task retries scheduled by workers, by path (eta: a broker ETA; parked: an outbox row).",
    ["path"],
)

DEAD_LETTERED = Counter(
    "celery_outbox_dead_lettered", "Tasks that became dead letters, by task name.", ["task"]
)

DUPLICATES_SKIPPED = Counter(
    "celery_outbox_duplicates_skipped",
    "Duplicate deliveries of atomic tasks skipped without running, by task name.",
    ["task"],
)


def connect() -> None:
    """Count from now on (idempotent: each receiver is connected once)."""
    for signal, receiver in _RECEIVERS:
        uid = f"celery_outbox.metrics.{receiver.__name__}"
        signal.connect(receiver, weak=False, dispatch_uid=uid)


def disconnect() -> None:
    """Stop counting (the counters keep their values; :func:`connect` resumes)."""
    for signal, receiver in _RECEIVERS:
        signal.disconnect(dispatch_uid=f"celery_outbox.metrics.{receiver.__name__}")


def on_published(
    sender: Any = None, messages: Sequence[StoredMessage] = (), path: str = "", **_: Any
) -> None:
    """Count published rows and observe how long each waited for the broker."""
    if not messages:
        return
    _child(PUBLISHED, path).inc(len(messages))
    now = utcnow()
    for message in messages:
        since = message.available_at
        if message.attempts > 0 and message.created_at is not None:
            since = message.created_at  # waited since its commit, through failed publishes
        PUBLISH_LATENCY.observe(max((now - since).total_seconds(), 0.0))


def on_publish_failed(sender: Any = None, task_ids: Sequence[str] = (), **_: Any) -> None:
    """Count rows a publish pass left unpublished."""
    PUBLISH_ERRORS.inc(len(task_ids))


def on_retry(sender: Any = None, path: str = "", **_: Any) -> None:
    """Count one retry by its path."""
    _child(RETRIES, path).inc()


def on_dead_lettered(sender: Any = None, **_: Any) -> None:
    """Count one dead letter of the task ``sender``."""
    _child(DEAD_LETTERED, _task_name(sender)).inc()


def on_duplicate_skipped(sender: Any = None, **_: Any) -> None:
    """Count one skipped duplicate of the task ``sender``."""
    _child(DUPLICATES_SKIPPED, _task_name(sender)).inc()


@functools.lru_cache(maxsize=4096)
def _child(counter: Counter, label: str) -> Any:
    """``counter.labels(label)``, kept: a publish on the request's path then costs one
    dictionary lookup, not the lock and checks of ``labels()`` (entry points and task
    names are few; the cache is bounded all the same).
    """
    return counter.labels(label)


def _task_name(task: Any) -> str:
    return str(getattr(task, "name", None) or "unknown")


_RECEIVERS = (
    (signals.message_published, on_published),
    (signals.message_publish_failed, on_publish_failed),
    (signals.task_retry_scheduled, on_retry),
    (signals.task_dead_lettered, on_dead_lettered),
    (signals.task_duplicate_skipped, on_duplicate_skipped),
)

# --- Prometheus metrics of the outbox (``pip install celery-outbox[prometheus]``).

connect()


@dataclass(frozen=True, kw_only=True)
class Snapshot:
    """What one scrape read: the store's state over the databases it covers.

    Counts are summed over the databases; ``oldest_pending_age`` is the longest wait of
    any of them; ``last_sweep_timestamp`` is the oldest of their last sweeps (0 when one
    of them has none yet), ``None`` when the store keeps no sweep record.
    """

    backlog: Backlog
    dead_letters: Mapping[str, int]
    workflows: Mapping[str, int]
    last_sweep_timestamp: float | None


def read_snapshot(
    store: OutboxStore, aliases: Sequence[str | None], *, bound: int | None = None
) -> Snapshot:
    """Read ``store`` over ``aliases``: per database, the backlog (the ``status,
    available_at`` index), dead letters and workflows by status (a count per status
    each) and the sweep record; counts above ``bound`` may be estimates
    (:mod:`celery_outbox.store.counts`; ``None``: exact).

    Raises
    ------
    StoreError
        A read failed.
    """
    backlogs = [store.backlog(using=alias, bound=bound) for alias in aliases]
    letters: dict[str, int] = {}
    workflows: dict[str, int] = {}
    for alias in aliases:
        _add(
            letters,
            {s.value: n for s, n in store.count_dead_letters(using=alias, bound=bound).items()},
        )
        _add(
            workflows,
            {str(s): n for s, n in store.count_workflows(using=alias, bound=bound).items()},
        )
    return Snapshot(
        backlog=_summed(backlogs),
        dead_letters=letters,
        workflows=workflows,
        last_sweep_timestamp=_last_sweep(store, aliases) if store.keeps_sweeps() else None,
    )


class OutboxCollector(Collector):
    """The outbox gauges, read from ``app``'s store at each scrape.

    Parameters
    ----------
    app
        The Celery app whose outbox store is read (``store_for(app)``, at scrape time).
    aliases
        The databases to read (default: every database the sweep covers).
    exact_up_to
        Counts are exact up to this many rows; above it, on PostgreSQL, they are the
        planner's estimate, so a scrape's cost does not grow with the tables
        (:mod:`celery_outbox.store.counts`; ``None``: always exact).
    """

    def __init__(
        self,
        app: Celery,
        *,
        aliases: Sequence[str | None] | None = None,
        exact_up_to: int | None = SCRAPE_EXACT_UP_TO,
    ) -> None:
        self.app = app
        self.aliases = None if aliases is None else list(aliases)
        self.exact_up_to = exact_up_to

    def describe(self) -> Iterable[GaugeMetricFamily]:
        """The gauges' names, without reading the store (so registering reads nothing)."""
        return _families(None, error=False)

    def collect(self) -> Iterable[GaugeMetricFamily]:
        """Read the store and yield the gauges (see the module for a failed read)."""
        store = store_for(self.app)
        aliases = store.sweep_aliases() if self.aliases is None else self.aliases
        try:
            snapshot = read_snapshot(store, aliases, bound=self.exact_up_to)
        except StoreError as exc:
            logger.warning("celery-outbox: metrics scrape could not read the outbox: %s", exc)
            return _families(None, error=True)
        return _families(snapshot, error=False)


def _families(snapshot: Snapshot | None, *, error: bool) -> Iterator[GaugeMetricFamily]:
    """The gauge families, with the values of ``snapshot`` (none: names only)."""
    yield GaugeMetricFamily(
        "celery_outbox_scrape_error",
        "1 when this scrape could not read the outbox store (its gauges are left out).",
        value=float(error),
    )
    if not error:
        yield from _store_families(snapshot)


def _store_families(snapshot: Snapshot | None) -> Iterator[GaugeMetricFamily]:
    backlog = None if snapshot is None else snapshot.backlog
    for name, text, value in (
        ("pending", "Pending rows due now (a publisher should have them).", "due"),
        ("parked", "Pending rows due later (parked retries, countdowns).", "parked"),
        ("failed", "Rows that gave up publishing (status failed).", "failed"),
    ):
        yield _gauge(name, text, None if backlog is None else getattr(backlog, value))
    age = None if backlog is None else backlog.oldest_due_age or timedelta(0)
    yield _gauge(
        "oldest_pending_age_seconds",
        "How long the longest-waiting due row has waited (0 without due rows).",
        None if age is None else age.total_seconds(),
    )
    yield _by_status(
        "dead_letters",
        "Dead letters by status.",
        None if snapshot is None else snapshot.dead_letters,
    )
    yield _by_status(
        "workflows", "Workflows by status.", None if snapshot is None else snapshot.workflows
    )
    if snapshot is None or snapshot.last_sweep_timestamp is not None:
        yield _gauge(
            "last_sweep_timestamp_seconds",
            "Unix time of the oldest last recorded sweep of the databases (0: none yet).",
            None if snapshot is None else snapshot.last_sweep_timestamp,
        )


def _gauge(name: str, text: str, value: float | None) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(f"celery_outbox_{name}", text)
    if value is not None:
        gauge.add_metric([], float(value))
    return gauge


def _by_status(name: str, text: str, counts: Mapping[str, int] | None) -> GaugeMetricFamily:
    gauge = GaugeMetricFamily(f"celery_outbox_{name}", text, labels=["status"])
    for status, count in (counts or {}).items():
        gauge.add_metric([status], float(count))
    return gauge


def _add(total: dict[str, int], counts: Mapping[str, int]) -> None:
    for status, count in counts.items():
        total[status] = total.get(status, 0) + count


def _summed(backlogs: Sequence[Backlog]) -> Backlog:
    ages = [b.oldest_due_age for b in backlogs if b.oldest_due_age is not None]
    return Backlog(
        due=sum(b.due for b in backlogs),
        parked=sum(b.parked for b in backlogs),
        failed=sum(b.failed for b in backlogs),
        oldest_due_age=max(ages, default=None),
    )


def _last_sweep(store: OutboxStore, aliases: Sequence[str | None]) -> float:
    sweeps = [store.last_sweep(using=alias) for alias in aliases]
    if not sweeps or any(s is None for s in sweeps):
        return 0.0
    return min(s.at.timestamp() for s in sweeps if s is not None)
