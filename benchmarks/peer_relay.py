"""django-celery-outbox's relay on N rows: run by ``benchmarks.peer`` in the peer's venv.

``python -m benchmarks.peer_relay ROWS BATCH_SIZE`` seeds ROWS rows exactly as its
``OutboxCelery.send_task`` writes them (bulk INSERT, not timed), runs its ``Relay`` batch
loop (the body of ``manage.py celery_outbox_relay``, with ``idle_time=0``) until the
table is empty, and prints ``RESULT {"rows_per_s": ...}``.
"""

from __future__ import annotations

import json
import os
import sys
import time

import django

os.environ["DJANGO_SETTINGS_MODULE"] = "benchmarks.peer_settings"
django.setup()

import structlog  # type: ignore[import-not-found]  # noqa: E402
from django_celery_outbox import OutboxCelery  # type: ignore[import-not-found]  # noqa: E402

from benchmarks.app import QUEUE, REDIS_URL  # noqa: E402

structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(40))
app = OutboxCelery("celery_outbox_bench_peer", broker=REDIS_URL, set_as_current=False)
app.conf.update(task_default_queue=QUEUE, task_ignore_result=True)


@app.task(name="bench.outbox_noop")  # type: ignore[untyped-decorator]
def outbox_noop(i: int) -> None:
    """The same task as ours."""


def seed(rows: int) -> None:
    """``rows`` pending rows, as ``send_task`` writes them."""
    from celery.utils import uuid
    from django_celery_outbox.models import CeleryOutbox  # type: ignore[import-not-found]
    from django_celery_outbox.serialization import (  # type: ignore[import-not-found]
        CURRENT_SCHEMA_VERSION,
        serialize_options,
    )

    CeleryOutbox.objects.all().delete()
    options = serialize_options({}, countdown=None, eta=None)
    CeleryOutbox.objects.bulk_create(
        [
            CeleryOutbox(
                task_id=uuid(),
                task_name=outbox_noop.name,
                args=[i],
                kwargs={},
                options=options,
                schema_version=CURRENT_SCHEMA_VERSION,
            )
            for i in range(rows)
        ],
        batch_size=2000,
    )


def relay_all(rows: int, batch_size: int) -> float:
    """Run the relay until no row is left; rows/s."""
    from django_celery_outbox.models import CeleryOutbox
    from django_celery_outbox.relay import Relay, RelayConfig  # type: ignore[import-not-found]

    relay = Relay(app, RelayConfig.init(batch_size=batch_size, idle_time=0.0))
    started = time.perf_counter()
    while CeleryOutbox.objects.exists():
        relay._processing()
    return rows / (time.perf_counter() - started)


def main(argv: list[str]) -> None:
    from django.core.management import call_command

    rows, batch_size = int(argv[0]), int(argv[1])
    call_command("migrate", verbosity=0, interactive=False)
    seed(rows)
    print("RESULT " + json.dumps({"rows_per_s": relay_all(rows, batch_size)}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1:])
