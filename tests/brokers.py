"""Broker helpers: per-test queue names and their removal, so tests never share messages."""

from __future__ import annotations

from kombu import Connection, Exchange, Queue

from tests.services import PROBE_TIMEOUT, unique_name

#: The kombu in-memory transport: the no-server broker default.
MEMORY_BROKER_URL = "memory://"


def new_queue_name() -> str:
    """A queue name no other test uses (uuid based)."""
    return unique_name("outbox-test-")


def celery_queue(name: str) -> Queue:
    """The queue Celery declares for ``-Q name``: a direct exchange and routing key ``name``."""
    return Queue(name, Exchange(name, type="direct"), routing_key=name)


def delete_queue(broker_url: str, name: str) -> None:
    """Delete queue ``name`` and its exchange of the same name, with any messages left in it.

    The queue is declared first: kombu's virtual transports (Redis) delete only the bindings
    the deleting channel knows, and declaring is a no-op where the queue already exists.
    """
    with Connection(broker_url, connect_timeout=PROBE_TIMEOUT) as conn:
        conn.ensure_connection(max_retries=1)
        queue = celery_queue(name)(conn.default_channel)
        queue.declare()
        queue.delete()
        queue.exchange.delete()


def purge_queue(broker_url: str, name: str) -> int:
    """Remove the messages waiting in queue ``name`` (declared first); how many there were.

    Messages a consumer already holds are not touched.
    """
    with Connection(broker_url, connect_timeout=PROBE_TIMEOUT) as conn:
        conn.ensure_connection(max_retries=1)
        queue = celery_queue(name)(conn.default_channel)
        queue.declare()
        return int(queue.purge() or 0)


def take_task_ids(broker_url: str, name: str) -> list[str]:
    """Consume every message waiting in queue ``name``; their task ids, in order."""
    with Connection(broker_url, connect_timeout=PROBE_TIMEOUT) as conn:
        queue = celery_queue(name)(conn.default_channel)
        ids = []
        while (message := queue.get(no_ack=True)) is not None:
            ids.append(message.headers["id"])
        return ids
