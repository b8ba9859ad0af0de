#!/usr/bin/env python
"""The celery-outbox demo: a shop whose order notifications fail over PUSH -> SMS -> messenger.

    python example_project/demo.py [--orders N] [--short] [--json PATH] [--var-dir DIR]

It needs no server. It creates a fresh SQLite database and a broker made of files under
``example_project/var/`` (or ``--var-dir``), migrates, creates the admin user
``admin``/``admin``, starts a real Celery worker with an embedded beat
(``celery -A shop_project worker -B``), takes the push, SMS and carrier providers down
for a few seconds, places orders (each order, its push notification and its fulfilment
workflow in one transaction), shows the notifications and workflows while retries back
off, then prints a summary counted from the database. The worker is stopped on exit,
also on Ctrl-C or on an error.

``--use-env`` runs against ``DATABASE_URL``, ``CELERY_BROKER_URL`` (and
``CELERY_RESULT_BACKEND`` if set) instead (PostgreSQL and Redis or RabbitMQ); otherwise
those variables are ignored.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import subprocess
import sys
import time
import uuid
from dataclasses import dataclass, replace
from pathlib import Path
from types import FrameType
from typing import IO, Any

HERE = Path(__file__).resolve().parent
DEFAULT_VAR_DIR = Path(os.environ.get("SHOP_VAR_DIR") or HERE / "var")
sys.path.insert(0, str(HERE))


@dataclass(frozen=True, kw_only=True)
class Plan:
    """How one demo run is timed (all durations in seconds)."""

    orders: int
    orders_per_second: float
    #: Seconds from the first order until each channel's provider is back up.
    outages: dict[str, float]
    retry_backoff: float
    park_after: float
    sweep_interval: float
    timeout: float


FULL = Plan(
    orders=40,
    orders_per_second=20.0,
    outages={"push": 6.0, "sms": 14.0, "carrier": 6.0},
    retry_backoff=1.0,
    park_after=2.0,
    sweep_interval=1.0,
    timeout=100.0,
)
SHORT = Plan(
    orders=12,
    orders_per_second=30.0,
    outages={"push": 3.0, "sms": 6.0, "carrier": 4.0},
    retry_backoff=0.5,
    park_after=1.0,
    sweep_interval=0.5,
    timeout=80.0,
)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    """The command line."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--orders", type=_positive, help="orders to place (default 40, short 12)")
    parser.add_argument("--short", action="store_true", help="fewer orders, shorter waits")
    parser.add_argument("--json", type=Path, help="also write the summary to this JSON file")
    parser.add_argument(
        "--var-dir",
        type=Path,
        default=DEFAULT_VAR_DIR,
        help="where the SQLite file and the broker folder go (wiped first; "
        "default $SHOP_VAR_DIR or example_project/var)",
    )
    parser.add_argument(
        "--use-env",
        action="store_true",
        help="use DATABASE_URL and CELERY_BROKER_URL from the environment",
    )
    return parser.parse_args(argv)


def _positive(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: give at least 1")
    return value


def environment(args: argparse.Namespace, plan: Plan, var_dir: Path) -> dict[str, str]:
    """Variables for this process and the worker: the embedded setup, the demo's timings."""
    env = {
        "DJANGO_SETTINGS_MODULE": "shop_project.settings",
        "SHOP_VAR_DIR": str(var_dir),
        "SHOP_WORKER_READY_FILE": str(var_dir / "worker.ready"),
        "PYTHONPATH": os.pathsep.join(filter(None, [str(HERE), os.environ.get("PYTHONPATH")])),
        # Short sweeps and a low parking threshold, so some retries park within seconds.
        "CELERY_OUTBOX_SWEEP_INTERVAL": str(plan.sweep_interval),
        "CELERY_OUTBOX_PARK_AFTER": str(plan.park_after),
        "CELERY_OUTBOX_PUBLISH_GRACE": "1.0",
        "CELERY_OUTBOX_KEEP_PUBLISHED": "86400",
        "SHOP_RETRY_BACKOFF": os.environ.get("SHOP_RETRY_BACKOFF", str(plan.retry_backoff)),
        "SHOP_MAX_RETRIES": os.environ.get("SHOP_MAX_RETRIES", "4"),
        "SHOP_FAILURE_RATES": os.environ.get(
            "SHOP_FAILURE_RATES", "push=0.35,sms=0.3,messenger=0.2,carrier=0.2"
        ),
        "SHOP_PROVIDER_SEED": os.environ.get("SHOP_PROVIDER_SEED", uuid.uuid4().hex[:8]),
    }
    if not args.use_env:
        env["DATABASE_URL"] = f"sqlite:///{var_dir / 'shop.sqlite3'}"
        env["CELERY_BROKER_URL"] = "filesystem://"
        # Celery reads CELERY_RESULT_BACKEND from the environment itself; blank, it falls
        # back to the settings (none). Celery's group results subscribe to a Redis backend
        # as the fulfilment's chord is dispatched: one set here would need its server.
        env["CELERY_RESULT_BACKEND"] = ""
    return env


def wipe(var_dir: Path, *, keep_database: bool) -> None:
    """Remove what an earlier run left in ``var_dir`` (only the files the demo makes)."""
    var_dir.mkdir(parents=True, exist_ok=True)
    names = ["broker", "outages", "worker.log", "worker.ready", "celerybeat-schedule*"]
    if not keep_database:
        names.append("shop.sqlite3*")
    for pattern in names:
        for path in var_dir.glob(pattern):
            shutil.rmtree(path) if path.is_dir() else path.unlink()
    (var_dir / "outages").mkdir()


def setup_database() -> None:
    """Migrate, and create the demo superuser ``admin``/``admin``."""
    import django
    from django.contrib.auth import get_user_model
    from django.core.management import call_command

    django.setup()
    call_command("migrate", verbosity=0)
    users = get_user_model().objects
    if not users.filter(username="admin").exists():
        users.create_superuser("admin", "admin@example.com", "admin")


class Worker:
    """``celery -A shop_project worker -B`` in its own process group, stopped by PID."""

    def __init__(self, var_dir: Path) -> None:
        self.ready_file = var_dir / "worker.ready"
        self.log_path = var_dir / "worker.log"
        self.process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start the worker with an embedded beat (it runs the outbox sweep)."""
        command = [
            sys.executable,
            "-m",
            "celery",
            "-A",
            "shop_project",
            "worker",
            "-B",
            "--loglevel",
            "INFO",
            "--concurrency",
            "4",
            "--without-mingle",
            "--without-gossip",
            "--without-heartbeat",
            "--hostname",
            "demo@%h",
        ]
        log: IO[bytes]
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                command, cwd=HERE, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
            )

    def wait_ready(self, timeout: float) -> None:
        """Wait until the worker consumes. Raises ``RuntimeError`` if it dies or is slow."""
        deadline = time.monotonic() + timeout
        while not self.ready_file.exists():
            self.check_alive()
            if time.monotonic() > deadline:
                raise RuntimeError(f"the worker was not ready after {timeout:.0f} s")
            time.sleep(0.1)

    def check_alive(self) -> None:
        """Raise ``RuntimeError`` (with the end of its log) if the worker exited."""
        if self.process is not None and self.process.poll() is not None:
            tail = self.log_path.read_text(errors="replace")[-3000:]
            raise RuntimeError(f"the worker exited ({self.process.returncode}):\n{tail}")

    def stop(self) -> None:
        """Warm shutdown (SIGTERM), then SIGKILL to its process group after 20 s."""
        process, self.process = self.process, None
        if process is None or process.poll() is not None:
            return
        process.terminate()
        try:
            process.wait(timeout=20)
        except subprocess.TimeoutExpired:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        print(f"Stopped the worker (pid {process.pid}).")


def place_orders(plan: Plan, batch: str) -> None:
    """Place ``plan.orders`` orders at ``plan.orders_per_second``."""
    from shop import services
    from shop.customers import customer

    for index in range(plan.orders):
        who = customer(index)
        services.place_order(
            customer=who.name,
            phone=who.phone,
            total=who.total,
            items=who.items,
            device=who.device,
            batch=batch,
        )
        time.sleep(1 / plan.orders_per_second)


def start_outages(plan: Plan, outage_dir: Path) -> None:
    """Take the providers of ``plan.outages`` down (the worker's fake provider checks)."""
    for channel in plan.outages:
        (outage_dir / f"{channel}.down").touch()


def end_outages(plan: Plan, outage_dir: Path, elapsed: float) -> None:
    """Bring each provider back up once its outage is over."""
    for channel, until in plan.outages.items():
        if elapsed >= until:
            (outage_dir / f"{channel}.down").unlink(missing_ok=True)


def watch(plan: Plan, batch: str, worker: Worker, outage_dir: Path, started: float) -> bool:
    """Show progress until every order settled; end outages on time. ``False``: timeout."""
    from shop.display import Display
    from shop.report import progress

    with Display(total=plan.orders, outage_dir=outage_dir) as display:
        while True:
            elapsed = time.monotonic() - started
            end_outages(plan, outage_dir, elapsed)
            state = progress(batch)
            display.update(state, elapsed)
            if state.done:
                return True
            worker.check_alive()
            if elapsed > plan.timeout:
                return False
            time.sleep(0.25)


def report(
    args: argparse.Namespace, plan: Plan, batch: str, *, elapsed: float, settled: bool
) -> bool:
    """Print the summary (and write it as JSON with ``--json``); ``True`` when every
    fulfilment workflow succeeded.
    """
    from django.conf import settings
    from shop.display import print_summary
    from shop.report import summarise

    summary = summarise(batch)
    print_summary(
        summary,
        elapsed=elapsed,
        settled=settled,
        sweep_interval=plan.sweep_interval,
        park_after=plan.park_after,
    )
    if args.json:
        data: dict[str, Any] = {
            **summary.as_dict(),
            "batch": batch,
            "settled": settled,
            "seconds": round(elapsed, 1),
            "database": str(settings.DATABASES["default"]["NAME"]),
        }
        args.json.write_text(json.dumps(data, indent=2))
    var_dir = args.var_dir.resolve()
    prefix = "" if var_dir == (HERE / "var").resolve() else f"SHOP_VAR_DIR={var_dir} "
    print("\nLook at the dead letters (and requeue or discard them) in the admin:")
    print(f"  {prefix}python {HERE.name}/manage.py runserver")
    print(
        "  open http://127.0.0.1:8000/admin/django_outbox/deadletter/  (user admin, password admin)"
    )
    print("  and the fulfilment workflows: http://127.0.0.1:8000/admin/django_outbox/workflow/")
    return summary.fulfilment.workflows["succeeded"] == summary.orders


def _terminate(signum: int, frame: FrameType | None) -> None:
    raise KeyboardInterrupt


def main(argv: list[str] | None = None) -> int:
    """Run the demo; 0 when every order settled in time and its fulfilment succeeded."""
    args = parse_args(argv)
    plan = SHORT if args.short else FULL
    if args.orders is not None:
        plan = replace(plan, orders=args.orders)
    var_dir = args.var_dir.resolve()
    wipe(var_dir, keep_database=args.use_env)
    os.environ.update(environment(args, plan, var_dir))
    signal.signal(signal.SIGTERM, _terminate)
    batch, began = uuid.uuid4().hex[:12], time.monotonic()
    print(f"celery-outbox demo: {plan.orders} orders, data in {var_dir}")
    setup_database()
    worker = Worker(var_dir)
    try:
        worker.start()
        worker.wait_ready(timeout=60)
        outages = ", ".join(f"{name} for {until:g} s" for name, until in plan.outages.items())
        print(
            f"Worker with embedded beat ready after {time.monotonic() - began:.1f} s. "
            f"Providers down from the first order: {outages}."
        )
        outage_dir = var_dir / "outages"
        start_outages(plan, outage_dir)
        started = time.monotonic()
        place_orders(plan, batch)
        settled = watch(plan, batch, worker, outage_dir, started)
        elapsed = time.monotonic() - started
    except KeyboardInterrupt:
        print("\nInterrupted: stopping the worker.")
        return 130
    except RuntimeError as exc:
        print(f"\nThe demo failed: {exc}", file=sys.stderr)
        return 1
    finally:
        worker.stop()
    fulfilled = report(args, plan, batch, elapsed=elapsed, settled=settled)
    print(f"\nDemo took {time.monotonic() - began:.1f} s.")
    return 0 if settled and fulfilled else 1


if __name__ == "__main__":
    sys.exit(main())
