"""The core never imports Django: at run time (a subprocess) and statically (import-linter)."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.worker import REPO_ROOT

WITHOUT_DJANGO = (
    "import sys; sys.modules['django'] = None; sys.modules['sqlalchemy'] = None; "
    "import celery_outbox; "
    # the pytest plugin loads in every pytest run of a project with celery-outbox installed
    "import celery_outbox.pytest_plugin, celery_outbox.testing.recorder"
)


#: The core, its Django app and its workers' modules without ``prometheus_client`` (the
#: ``prometheus`` extra): the metrics module alone needs it, and says how to get it.
WITHOUT_PROMETHEUS = (
    "import sys; sys.modules['prometheus_client'] = None; "
    "import celery_outbox, celery_outbox.relay.relay, celery_outbox.worker.republish; "
    "import celery_outbox.metrics"
)

CACHES = shutil.ignore_patterns("__pycache__")


def _lint_imports() -> str:
    pytest.importorskip("importlinter")
    executable = Path(sys.executable).with_name("lint-imports")
    return (
        str(executable) if executable.exists() else shutil.which("lint-imports") or "lint-imports"
    )


def _run(argv: list[str], *, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, cwd=cwd, capture_output=True, text=True, timeout=300, check=False)


def test_core_imports_without_django_or_sqlalchemy() -> None:
    result = _run([sys.executable, "-c", WITHOUT_DJANGO], cwd=REPO_ROOT)

    assert result.returncode == 0, result.stderr


def test_core_imports_without_prometheus_client_and_metrics_names_the_extra() -> None:
    result = _run([sys.executable, "-c", WITHOUT_PROMETHEUS], cwd=REPO_ROOT)

    assert result.returncode == 1
    assert "ImportError: celery_outbox.metrics needs prometheus_client" in result.stderr
    assert "pip install celery-outbox[prometheus]" in result.stderr


def test_django_app_starts_without_prometheus_client() -> None:
    code = (
        "import sys; sys.modules['prometheus_client'] = None; import django; "
        "from django.conf import settings; "
        "settings.configure(INSTALLED_APPS=['django.contrib.contenttypes', "
        "'django.contrib.auth', 'django_outbox']); django.setup(); "
        "print('celery_outbox.metrics' in sys.modules)"
    )
    result = _run([sys.executable, "-c", code], cwd=REPO_ROOT)

    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "False"


def test_import_linter_contract_holds() -> None:
    result = _run([_lint_imports(), "--no-cache"], cwd=REPO_ROOT)

    assert result.returncode == 0, result.stdout + result.stderr
    assert "The core never imports Django KEPT" in result.stdout


def test_import_linter_contract_bites(tmp_path: Path) -> None:
    lint_imports = _lint_imports()
    for package in ("celery_outbox", "django_outbox"):
        shutil.copytree(REPO_ROOT / package, tmp_path / package, ignore=CACHES)
    shutil.copy(REPO_ROOT / "pyproject.toml", tmp_path / "pyproject.toml")
    (tmp_path / "celery_outbox" / "_forbidden.py").write_text(
        "from __future__ import annotations\n\nimport django\n"
    )

    result = _run([lint_imports, "--no-cache"], cwd=tmp_path)

    assert result.returncode != 0, result.stdout
    assert "The core never imports Django BROKEN" in result.stdout
    assert "celery_outbox._forbidden -> django" in result.stdout
