"""``outbox relay``: sweep continuously until SIGTERM or SIGINT.

It sweeps after every ``--poll`` seconds of idleness, sooner when a parked row comes due,
and at once when PostgreSQL notifies a new row nobody publishes at commit
(:mod:`celery_outbox.store.base`; ``--no-listen`` polls only).
"""

from __future__ import annotations

import signal
import threading
from argparse import ArgumentParser
from dataclasses import replace
from datetime import timedelta
from typing import Any

from django.core.management.base import BaseCommand

from celery_outbox.config import RULES, Seconds
from django_outbox.management.outbox_commands._arguments import seconds
from django_outbox.management.outbox_commands._context import add_database_argument, load_context

HELP = "Publish due rows continuously (sub-second recovery); stop with SIGTERM or Ctrl-C."
#: Accepted ``--poll``: NaN or 0 once made the loop spin (109,810 log lines in 6 s).
POLL = Seconds(minimum=0.01, maximum=3600.0)
#: Accepted ``--grace``: what ``outbox_publish_grace`` accepts.
GRACE = RULES["outbox_publish_grace"]


def add_arguments(parser: ArgumentParser) -> None:
    add_database_argument(parser)
    parser.add_argument(
        "--poll",
        type=seconds(POLL),
        default=0.2,
        help=f"seconds between idle passes (default 0.2; {POLL.accepted})",
    )
    parser.add_argument(
        "--grace",
        type=seconds(GRACE),
        default=None,
        help="seconds a fresh row is left to its on-commit publisher "
        f"(default outbox_publish_grace; 0 publishes at once; {GRACE.accepted})",
    )
    parser.add_argument(
        "--no-listen",
        action="store_true",
        help="poll only: no LISTEN for NOTIFY of new rows on PostgreSQL databases",
    )


def handle(command: BaseCommand, options: dict[str, Any]) -> None:
    context = load_context(options["database"])
    if options["grace"] is not None:
        context = replace(
            context,
            config=replace(context.config, publish_grace=timedelta(seconds=options["grace"])),
        )
    sweeper = context.sweeper()
    stop = threading.Event()
    previous = {
        sig: signal.signal(sig, lambda *_: stop.set()) for sig in (signal.SIGTERM, signal.SIGINT)
    }
    listen = not options["no_listen"]
    woken = ", woken by NOTIFY where the database has it" if listen else ""
    command.stdout.write(f"outbox relay: polling every {options['poll']} s{woken}")
    try:
        sweeper.run(stop, options["poll"], aliases=context.aliases, listen=listen)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    command.stdout.write("outbox relay: stopped")
