"""``manage.py check`` in a fresh process, as a user runs it: a bad ``outbox_*`` setting is
reported every time, whatever order Django runs its checks in (it once depended on
whether something had read the Celery configuration first).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]

#: A project as Celery's Django guide makes one: the app in ``proj/celery.py``, imported
#: by ``proj/__init__.py``, configured from Django's settings with the CELERY namespace.
FILES = {
    "proj/__init__.py": "from .celery import app as celery_app\n",
    "proj/celery.py": (
        "import os\n"
        "from celery import Celery\n"
        "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'proj.settings')\n"
        "app = Celery('proj')\n"
        "app.config_from_object('django.conf:settings', namespace='CELERY')\n"
    ),
    "proj/settings.py": (
        "SECRET_KEY = 'x'\n"
        "USE_TZ = True\n"
        "INSTALLED_APPS = ['django.contrib.contenttypes', 'django.contrib.auth', "
        "'django_outbox']\n"
        "DATABASES = {'default': {'ENGINE': 'django.db.backends.sqlite3', 'NAME': ':memory:'}}\n"
        "CELERY_BROKER_URL = 'memory://'\n"
        "CELERY_OUTBOX_MAX_DELIVERIES = 'many'\n"
    ),
    "manage.py": (
        "import os, sys\n"
        "os.environ.setdefault('DJANGO_SETTINGS_MODULE', 'proj.settings')\n"
        "from django.core.management import execute_from_command_line\n"
        "execute_from_command_line(sys.argv)\n"
    ),
}

RUNS = 5


def write_project(where: Path) -> Path:
    """The project's files in ``where``."""
    for name, text in FILES.items():
        (where / name).parent.mkdir(parents=True, exist_ok=True)
        (where / name).write_text(text)
    return where


def test_a_bad_outbox_setting_is_reported_by_every_fresh_check(tmp_path: Path) -> None:
    # Django keeps its checks in a set, so their order follows the memory layout, which
    # the project's path changes: each run gets a path of another length.
    outputs = []
    for run in range(RUNS):
        project = write_project(tmp_path / ("proj" + "x" * 13 * run))
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(project), str(ROOT)]),
            "DJANGO_SETTINGS_MODULE": "proj.settings",
        }
        done = subprocess.run(
            [sys.executable, "manage.py", "check"],
            cwd=project,
            env=env,
            capture_output=True,
            text=True,
            timeout=60,
        )
        outputs.append((done.returncode, done.stdout + done.stderr))
    missed = [out for code, out in outputs if code == 0 or "django_outbox.E001" not in out]
    assert not missed, f"{len(missed)} of {RUNS} checks missed the bad setting:\n{missed[0]}"
    assert all("outbox_max_deliveries='many'" in out for _, out in outputs), outputs[0][1]
