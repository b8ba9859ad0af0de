"""The Celery app of the chaos soak (``test_soak.py``): every reliability task in one app.

It is the reliability app (:mod:`tests.reliability.app`: ``record``, ``flaky`` ...) plus
the atomic tasks of the atomic chaos scenario (:mod:`tests.reliability.atomic_app`) and
the atomic workflow steps of the workflow chaos scenario
(:mod:`tests.reliability.workflow_chaos_app`), so one worker runs all of the soak's load.
The test process, the workers (``celery -A tests.reliability.soak_app worker``) and the
sweeper (``python -m tests.reliability.soak_sweeper``) build it from the same
``RELIABILITY_*`` variables.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping
from typing import Any

from celery import Celery
from sqlalchemy import Engine

from celery_outbox.sqlalchemy import SQLAlchemyOutboxStore
from tests.reliability.atomic_app import (
    ATOMIC_ADD,
    ATOMIC_FOLLOW,
    create_chaos_tables,
    register_chaos_tasks,
)
from tests.reliability.workflow_chaos_app import (
    COLLECT,
    STEP,
    register_outbox_tasks,
    wfc_metadata,
)

#: Retries of the atomic tasks: a delivery that cannot open its transaction while the
#: database is down or starting up is retried like a failure of its body, and the fast
#: windows of the reliability app (0.2 s, then up to 1 s) would spend Celery's default 3
#: within an outage: the soak's first 600 s run dead-lettered a workflow step so (the
#: store's "could not start an atomic task: ... not yet accepting connections").
#: 50 retries outlast every outage the soak makes (at most 5 s, plus the restart).
ATOMIC_RETRIES = 50

#: The soak's settings over the reliability app's (fast) ones: retries waiting over 0.5 s
#: are parked in the table; published rows are kept (so that the chaos can publish some
#: again); a step killed under its child many times is not dead-lettered by design.
SOAK_CONF: dict[str, Any] = {
    "outbox_park_after": 0.5,
    "outbox_keep_published": 3600.0,
    "outbox_max_deliveries": 50,
    "task_annotations": {
        name: {"max_retries": ATOMIC_RETRIES} for name in (ATOMIC_ADD, ATOMIC_FOLLOW, STEP, COLLECT)
    },
}


def soak_seconds(environ: Mapping[str, str] = os.environ) -> float:
    """``OUTBOX_SOAK_SECONDS`` (default 600): seconds of load and chaos before the drain."""
    raw = environ.get("OUTBOX_SOAK_SECONDS", "600")
    try:
        seconds = float(raw)
    except ValueError:
        seconds = -1.0
    if not 10 <= seconds <= 24 * 3600:
        raise ValueError(f"OUTBOX_SOAK_SECONDS={raw!r}: expected seconds from 10 to 86400")
    return seconds


def create_soak_app(
    *, broker: str, db_url: str, queue: str, ledger_dir: str, **conf: Any
) -> tuple[Celery, SQLAlchemyOutboxStore]:
    """The reliability app with the atomic chaos tasks and the atomic workflow steps."""
    from tests.reliability.app import create_app

    app, store = create_app(
        broker=broker, db_url=db_url, queue=queue, ledger_dir=ledger_dir, **{**SOAK_CONF, **conf}
    )
    register_chaos_tasks(app, store, ledger_dir)
    register_outbox_tasks(app, ledger_dir)
    return app, store


def create_soak_tables(engine: Engine) -> None:
    """The outbox tables, the reliability tables, and those of both chaos scenarios."""
    create_chaos_tables(engine)
    wfc_metadata.create_all(engine)


def env_app() -> tuple[Celery, SQLAlchemyOutboxStore]:
    """The app built from the ``RELIABILITY_*`` environment variables."""
    return create_soak_app(
        broker=os.environ["RELIABILITY_BROKER"],
        db_url=os.environ["RELIABILITY_DB"],
        queue=os.environ["RELIABILITY_QUEUE"],
        ledger_dir=os.environ["RELIABILITY_LEDGER"],
        **json.loads(os.environ.get("RELIABILITY_CONF") or "{}"),
    )


if "RELIABILITY_BROKER" in os.environ:
    app, store = env_app()
