"""A sweeper in a process of its own, for concurrency and crash tests.

``python -m tests.integration.sweep_process [--go FILE] [--publish-delay S]`` sweeps the
database of :mod:`tests.integration.sweep_app` (``OUTBOX_TEST_*`` variables) until a sweep
finds nothing, then prints its totals as one JSON line. With ``--go`` it prints ``ready``
first, once set up; it prints ``claimed N`` as soon as it holds a batch, so a test can kill
it mid-batch.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

from celery_outbox.config import OutboxConfig
from celery_outbox.relay.relay import relay_for
from celery_outbox.relay.sweeper import Sweeper, SweepReport
from celery_outbox.store.records import Claim
from tests.integration.sweep_app import app


class AnnouncingSweeper(Sweeper):
    """Says when it holds rows (the test's cue to kill it)."""

    def _claim(self, using: str | None) -> Claim:
        claim = super()._claim(using)
        if claim.messages:
            print(f"claimed {len(claim.messages)}", flush=True)
        return claim


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--go", type=Path, help="wait for this file before sweeping")
    parser.add_argument("--publish-delay", type=float, default=0.0)
    args = parser.parse_args(argv)
    relay = relay_for(app)
    if args.publish_delay:
        slow_down(relay, args.publish_delay)
    sweeper = AnnouncingSweeper(
        app=app,
        store=relay.store,
        relay=relay,
        config=OutboxConfig.from_celery(app),
        budget=timedelta(minutes=10),
    )
    if args.go:
        print("ready", flush=True)  # imported and set up: the test may say go
    while args.go and not args.go.exists():
        time.sleep(0.005)
    total = SweepReport()
    while (report := sweeper.sweep()).batches:
        total += report
    print(json.dumps(total.as_dict()), flush=True)


def slow_down(relay: Any, delay: float) -> None:
    """Make every publish of ``relay`` take ``delay`` seconds longer, one message at a time.

    Without Redis pipelining, so messages reach the broker one by one and a kill lands
    in the middle of a batch.
    """
    producers = relay.producers
    producers.batch_publish = False
    publish_one = producers.publish_one

    def slow(*args: Any, **kwargs: Any) -> None:
        time.sleep(delay)
        publish_one(*args, **kwargs)

    producers.publish_one = slow


if __name__ == "__main__":
    main(sys.argv[1:])
