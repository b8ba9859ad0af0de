"""A producer process: commits transactions that dispatch tasks, then may SIGKILL itself.

``python -m tests.reliability.producer RUN TRANSACTIONS BATCH FINAL [--die-after-commit]``
(with the ``RELIABILITY_*`` environment of :mod:`tests.reliability.app`) commits
``TRANSACTIONS`` transactions of ``BATCH`` tasks and a last one of ``FINAL`` tasks. Each
transaction also writes its keys to ``reliability_expected``, so the keys there are
exactly the dispatches that committed. With ``--die-after-commit`` the process SIGKILLs
itself in the last transaction's first after-commit callback, registered before the
outbox's publish callback: the rows are committed and never published by this process.
"""

from __future__ import annotations

import argparse
import os
import signal

from sqlalchemy import insert
from sqlalchemy.orm import Session

from tests.reliability.app import RECORD, env_app, expected_table


def _die() -> None:
    os.kill(os.getpid(), signal.SIGKILL)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("run")
    parser.add_argument("transactions", type=int)
    parser.add_argument("batch", type=int)
    parser.add_argument("final", type=int)
    parser.add_argument("--die-after-commit", action="store_true")
    options = parser.parse_args()
    app, store = env_app()
    record = app.tasks[RECORD]
    sizes = [options.batch] * options.transactions + [options.final]
    for number, size in enumerate(sizes):
        last = number == len(sizes) - 1
        with Session(store.engine) as session, session.begin(), store.bind_session(session):
            if last and options.die_after_commit:
                store.on_commit(_die)
            keys = [f"{options.run}-{number}-{i}" for i in range(size)]
            session.execute(insert(expected_table), [{"key": key} for key in keys])
            for key in keys:
                record.apply_async((key,), task_id=key)


if __name__ == "__main__":
    main()
