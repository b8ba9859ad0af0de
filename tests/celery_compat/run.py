"""``python -m tests.celery_compat.run``: Celery's own integration tests, plain and on the outbox.

Downloads the source distribution of the installed Celery from the package index (pip,
cached under ``.celery-compat/``; never vendored), installs what its integration tests
import beyond the project's environment (pydantic) beside it, then runs
``t/integration/test_tasks.py`` and ``t/integration/test_canvas.py`` against real Redis
(broker and result backend) twice: once with Celery's plain app, once with every task an
``OutboxTask`` (``task_cls``) on the SQLAlchemy store in a fresh PostgreSQL database. It
prints both counts and every test whose outcome differs, with the reason
:mod:`tests.celery_compat.known` gives, and exits non-zero when a test passes plain but
not on the outbox without a known reason.

Options: ``-k EXPR`` selects tests as pytest does (``--fast``: the canvas and retry
subset CI runs), ``--mode plain|outbox`` runs one side only, ``--no-autoretry`` gives
the outbox run's tasks ``autoretry_for = ()`` (the documented option that switches off the
intended difference: then no difference is explained by retries), ``--timeout`` bounds each
test (seconds). Services come from ``OUTBOX_TEST_REDIS_URL`` / ``OUTBOX_TEST_POSTGRES_URL``
(loopback defaults), as for the rest of the suite.
"""

from __future__ import annotations

import argparse
import hashlib
import importlib.metadata
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tarfile
import xml.etree.ElementTree as ET
from collections import Counter
from pathlib import Path
from urllib.parse import urlsplit

from sqlalchemy.engine import make_url

from tests import services
from tests.celery_compat.known import FAST, reason_for

ROOT = Path(__file__).resolve().parents[2]
FILES = ("t/integration/test_tasks.py", "t/integration/test_canvas.py")
#: What t/integration imports that the project's environment may lack.
EXTRA_REQUIREMENTS = {"pydantic": "pydantic>=2"}
MODES = ("plain", "outbox")


def main(argv: list[str] | None = None) -> int:
    """Run the comparison; the process exit status."""
    args = _parser().parse_args(argv)
    cache = Path(args.cache).resolve()
    version = importlib.metadata.version("celery")
    sdist = fetch_sdist(version, cache)
    site = install_extras(cache / f"site-{sys.version_info[0]}{sys.version_info[1]}")
    shutil.copyfile(Path(__file__).with_name("sdist_conftest.py"), sdist / "t" / "conftest.py")
    selection = args.k or (FAST if args.fast else None)
    autoretry = not args.no_autoretry
    postgres = services.SERVICES["postgres"].url
    database = services.unique_name("outbox_compat_")
    services.create_postgres_database(postgres, database)
    try:
        url = make_url(services.with_db_name(postgres, database))
        env = _env(
            site,
            redis=services.SERVICES["redis"].url,
            database=url.set(drivername="postgresql+psycopg").render_as_string(hide_password=False),
        )
        outcomes = {
            mode: outcomes_of(report_path(cache, mode, selection))
            if args.reuse_plain and mode == "plain"
            else run_mode(
                mode,
                sdist,
                cache,
                env,
                selection=selection,
                timeout=args.timeout,
                autoretry=autoretry,
            )
            for mode in (MODES if args.mode == "both" else (args.mode,))
        }
    finally:
        services.drop_postgres_database(postgres, database)
    return report(version, outcomes, autoretry=autoretry)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="python -m tests.celery_compat.run")
    parser.add_argument("-k", help="pytest -k expression selecting Celery's tests")
    parser.add_argument("--fast", action="store_true", help="the canvas and retry subset")
    parser.add_argument("--mode", choices=("both", *MODES), default="both")
    parser.add_argument(
        "--no-autoretry", action="store_true", help="the outbox run with autoretry_for = ()"
    )
    parser.add_argument("--timeout", type=int, default=120, help="seconds per test")
    parser.add_argument("--cache", default=str(ROOT / ".celery-compat"))
    parser.add_argument(
        "--reuse-plain", action="store_true", help="compare with the last plain run's report"
    )
    return parser


def fetch_sdist(version: str, cache: Path) -> Path:
    """Celery's source distribution ``version``, downloaded once and unpacked."""
    target = cache / f"celery-{version}"
    if (target / "t" / "integration").is_dir():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    spec = f"celery=={version}"
    subprocess.run(
        [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps", spec,
         "-d", str(cache), "--quiet"],
        check=True,
    )  # fmt: skip
    with tarfile.open(cache / f"celery-{version}.tar.gz") as archive:
        archive.extractall(cache, filter="data")
    return target


def install_extras(site: Path) -> str:
    """Install the missing extra requirements into ``site``; the path to append."""
    missing = [req for module, req in EXTRA_REQUIREMENTS.items() if not _importable(module, site)]
    if missing:
        subprocess.run(
            [sys.executable, "-m", "pip", "install", "--quiet", "--target", str(site), *missing],
            check=True,
        )
    return str(site)


def _importable(module: str, site: Path) -> bool:
    return importlib.util.find_spec(module) is not None or (site / module).is_dir()


def _env(site: str, *, redis: str, database: str) -> dict[str, str]:
    env = dict(os.environ)
    host = urlsplit(redis)
    env.update(
        PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [env.get("PYTHONPATH")])]),
        CELERY_COMPAT_SITE=site,
        CELERY_COMPAT_DATABASE=database,
        TEST_BROKER=redis,
        TEST_BACKEND=redis,
        REDIS_HOST=host.hostname or "localhost",
        REDIS_PORT=str(host.port or 6379),
    )
    return env


def run_mode(
    mode: str,
    sdist: Path,
    cache: Path,
    env: dict[str, str],
    *,
    selection: str | None,
    timeout: int,
    autoretry: bool = True,
) -> dict[str, str]:
    """Run the two files with ``mode``'s app; each test's outcome by node id."""
    settings = {"outbox_store": "tests.celery_compat.store:build"} if mode == "outbox" else {}
    (sdist / "integration-tests-config.json").write_text(json.dumps(settings))
    autoretry = autoretry or mode == "plain"
    junit = report_path(cache, mode if autoretry else f"{mode}-no-autoretry", selection)
    command = [
        sys.executable, "-m", "pytest", *FILES, "-p", "no:cacheprovider", "-q",
        "-p", "celery.contrib.pytest", "-p", "no:django", f"--timeout={timeout}",
        f"--junitxml={junit}",
        *(["-k", selection] if selection else []),
    ]  # fmt: skip
    print(f"\n=== {mode}{'' if autoretry else ' (autoretry_for = ())'}: {' '.join(command[1:])}")
    sys.stdout.flush()
    mode_env = {"CELERY_COMPAT_MODE": mode, "CELERY_COMPAT_AUTORETRY": "on" if autoretry else "off"}
    subprocess.run(command, cwd=sdist, env={**env, **mode_env}, check=False)
    return outcomes_of(junit)


def report_path(cache: Path, mode: str, selection: str | None) -> Path:
    """The JUnit report of ``mode``'s run of ``selection`` (one per selection)."""
    if not selection:
        return cache / f"{mode}.xml"
    digest = hashlib.sha1(selection.encode(), usedforsecurity=False).hexdigest()[:10]
    return cache / f"{mode}-{digest}.xml"


def outcomes_of(junit: Path) -> dict[str, str]:
    """``passed``/``failed``/``error``/``skipped`` of every test case in a JUnit report."""
    found: dict[str, str] = {}
    for case in ET.parse(junit).getroot().iter("testcase"):
        name = f"{case.get('classname')}::{case.get('name')}"
        kinds = {child.tag for child in case}
        outcome = next((k for k in ("error", "failure", "skipped") if k in kinds), "passed")
        found[name] = {"failure": "failed"}.get(outcome, outcome)
    return found


def report(version: str, results: dict[str, dict[str, str]], *, autoretry: bool = True) -> int:
    """Print the counts and the differences; 1 when a difference has no known reason.

    With ``autoretry`` off (the outbox run's tasks had ``autoretry_for = ()``) the retries
    explain no difference.
    """
    print(f"\n=== Celery {version}: t/integration/test_tasks.py + test_canvas.py")
    if not autoretry:
        print("(the outbox run's tasks with autoretry_for = ())")
    for mode, found in results.items():
        counts = Counter(found.values())
        print(f"{mode:>7}: " + ", ".join(f"{counts[k]} {k}" for k in sorted(counts)))
    if set(results) != set(MODES):
        return 0
    plain, outbox = results["plain"], results["outbox"]
    unexplained = 0
    for name in sorted(set(plain) | set(outbox)):
        before, after = plain.get(name, "absent"), outbox.get(name, "absent")
        if before == after:
            continue
        reason = reason_for(name, autoretry=autoretry)
        if before == "passed" and reason is None:
            unexplained += 1
        print(f"  {name}: plain {before}, outbox {after} -- {reason or 'NO KNOWN REASON'}")
    print(f"differences without a known reason (passing plain only): {unexplained}")
    return 1 if unexplained else 0


if __name__ == "__main__":
    raise SystemExit(main())
