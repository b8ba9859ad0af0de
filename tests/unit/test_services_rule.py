"""An unreachable service skips its tests locally and fails them with OUTBOX_REQUIRE_SERVICES=1."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.services import free_port
from tests.worker import REPO_ROOT

NEEDS_REDIS = """
from __future__ import annotations


def test_needs_redis(redis_url: str) -> None:
    assert redis_url
"""


def _run_pytest(tmp_path: Path, *, require: bool) -> subprocess.CompletedProcess[str]:
    (tmp_path / "test_needs_redis.py").write_text(NEEDS_REDIS)
    env = {key: value for key, value in os.environ.items() if key != "OUTBOX_REQUIRE_SERVICES"}
    env["OUTBOX_TEST_REDIS_URL"] = f"redis://127.0.0.1:{free_port()}/0"
    env["PYTHONPATH"] = str(REPO_ROOT)
    if require:
        env["OUTBOX_REQUIRE_SERVICES"] = "1"
    argv = [sys.executable, "-m", "pytest", "-p", "tests.conftest", "-p", "no:django"]
    argv += ["-p", "no:cacheprovider", "-rs", "--rootdir", str(tmp_path), str(tmp_path)]
    return subprocess.run(
        argv, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120, check=False
    )


def _summary_lines(output: str) -> list[str]:
    return [line for line in output.splitlines() if line.startswith("celery-outbox: service")]


def test_unreachable_service_is_skipped_with_one_summary_line(tmp_path: Path) -> None:
    result = _run_pytest(tmp_path, require=False)

    assert result.returncode == pytest.ExitCode.OK, result.stdout
    assert "1 skipped" in result.stdout
    (line,) = _summary_lines(result.stdout)
    assert "service redis unreachable" in line
    assert "OUTBOX_TEST_REDIS_URL" in line


def test_unreachable_service_fails_when_services_are_required(tmp_path: Path) -> None:
    result = _run_pytest(tmp_path, require=True)

    assert result.returncode == pytest.ExitCode.TESTS_FAILED, result.stdout
    assert "1 error" in result.stdout
    assert "OUTBOX_REQUIRE_SERVICES=1 but redis unreachable at redis://127.0.0.1:" in result.stdout
    (line,) = _summary_lines(result.stdout)
    assert "tests FAILED" in line
