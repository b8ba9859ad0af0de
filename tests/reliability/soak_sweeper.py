"""The soak's sweeper: a process of its own that the chaos SIGKILLs and starts again.

``python -m tests.reliability.soak_sweeper INTERVAL`` (with the ``RELIABILITY_*``
environment of :mod:`tests.reliability.soak_app`) sweeps the outbox every ``INTERVAL``
seconds, as beat's sweep entry would, until it is killed. A sweep that fails (the broker
or the database is down) is logged and the next one goes on, as the next beat tick would.
"""

from __future__ import annotations

import sys
import time

from celery_outbox.sweep_task import sweep_app
from tests.reliability.soak_app import env_app


def main(argv: list[str]) -> None:
    interval = float(argv[0]) if argv else 0.5
    app, _store = env_app()
    while True:
        try:
            report = sweep_app(app)
        except Exception as exc:  # a server is down: the next sweep goes on
            print(f"sweep failed: {type(exc).__name__}: {exc}", flush=True)
        else:
            if report.published or report.failed:
                print(f"swept {report.as_dict()}", flush=True)
        time.sleep(interval)


if __name__ == "__main__":
    main(sys.argv[1:])
