"""The soak's disturbances, drawn at random and stepped from the test's own loop.

Every ``every`` seconds on average (:meth:`SoakChaos.step`) one of these happens, drawn
with :data:`WEIGHTS`:

- ``child``: SIGKILL one pool child of one worker (never its main process);
- ``worker``: SIGKILL a whole worker (main process and children); its
  :class:`~tests.reliability.harness.Supervisor` starts a new one, as systemd would;
- ``sweeper``: SIGKILL the sweeper process (:mod:`tests.reliability.soak_sweeper`),
  started again 0-3 s later;
- ``redis``: stop the throwaway broker (SIGTERM or SIGKILL) for 1-5 s;
- ``postgres``: stop the throwaway database (``fast`` or ``immediate``) for 1-5 s.

All along, one published row in five is made pending again
(:meth:`~tests.reliability.chaos.Chaos.republish`), so that the sweeper publishes the
same message a second time, and each worker is supervised: one that exited, or made no
progress for ``STALL_AFTER`` seconds while work was left, is restarted (and counted).
:meth:`SoakChaos.calm` ends the disturbances and brings everything back up.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Callable
from pathlib import Path

from sqlalchemy.exc import SQLAlchemyError

from tests.reliability.chaos import Chaos
from tests.reliability.harness import ScenarioEnv, Supervisor
from tests.reliability.servers import ThrowawayPostgres, ThrowawayRedis
from tests.worker import REPO_ROOT, WorkerProcess, WorkerStartError, worker_env

#: How often each disturbance is drawn, relative to the others.
WEIGHTS = {"child": 4.0, "worker": 1.0, "sweeper": 1.5, "redis": 1.0, "postgres": 1.0}
#: Seconds a server stays down, and before a killed sweeper is started again.
OUTAGE, SWEEPER_DOWN = (1.0, 5.0), (0.0, 3.0)
#: Seconds without a worker's log growing, with work left, before it counts as stuck.
STALL_AFTER = 15.0
#: Seconds between two republishing rounds (each reads every published row).
REPUBLISH_EVERY = 2.0
#: Seconds between two sweeps of the sweeper process.
SWEEP_INTERVAL = 0.5


class SweeperProcess:
    """``python -m tests.reliability.soak_sweeper`` in a session of its own."""

    def __init__(self, env: ScenarioEnv, log_path: Path) -> None:
        self.env = env
        self.log_path = log_path
        self._process: subprocess.Popen[bytes] | None = None

    def start(self) -> None:
        """Start it (again)."""
        with self.log_path.open("ab") as log:
            self._process = subprocess.Popen(
                [sys.executable, "-m", "tests.reliability.soak_sweeper", str(SWEEP_INTERVAL)],
                cwd=REPO_ROOT,
                env=worker_env(self.env.as_env()),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    def is_running(self) -> bool:
        """Whether it was started and has not exited."""
        return self._process is not None and self._process.poll() is None

    def kill(self) -> None:
        """SIGKILL it (the PID it was started with) and reap it."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            os.kill(process.pid, signal.SIGKILL)
            process.wait(timeout=30)


class SoakChaos:
    """Draws and undoes the disturbances; counts each, and the worker restarts."""

    def __init__(
        self,
        *,
        rng: random.Random,
        every: float,
        redis: ThrowawayRedis,
        postgres: ThrowawayPostgres,
        workers: dict[str, Supervisor],
        sweeper: SweeperProcess,
        republisher: Chaos,
        work_left: Callable[[], bool],
    ) -> None:
        self.rng, self.every = rng, every
        self.redis, self.postgres = redis, postgres
        self.workers, self.sweeper, self.republisher = workers, sweeper, republisher
        self.work_left = work_left
        self.done: Counter[str] = Counter()
        self.start_failures = 0
        self._up_at: dict[str, float] = {}  # what is down, and when it comes back
        self._next = time.monotonic() + self._interval()
        # Each disturbance once first (in a random order), so that a short run has them all.
        self._first = rng.sample(list(WEIGHTS), len(WEIGHTS))
        self._last_republish = 0.0
        self._idle = itertools.count(-1, -1)

    def _interval(self) -> float:
        return self.rng.uniform(0.5, 1.5) * self.every

    def step(self, *, disturb: bool = True) -> None:
        """Bring back what is due, draw a disturbance when one is due, republish, supervise."""
        now = time.monotonic()
        for name, up_at in list(self._up_at.items()):
            if now >= up_at:
                self._bring_up(name)
        if disturb and now >= self._next:
            self._next = now + self._interval()
            names = list(WEIGHTS)
            drawn = self.rng.choices(names, weights=[WEIGHTS[n] for n in names])[0]
            self._disturb(self._first.pop() if self._first else drawn)
        if "postgres" not in self._up_at and now - self._last_republish >= REPUBLISH_EVERY:
            self._last_republish = now
            with contextlib.suppress(SQLAlchemyError):  # the database went away: next round
                self.republisher.republish()
        self.supervise()

    def calm(self) -> None:
        """No more disturbances: everything down comes back up now."""
        for name in list(self._up_at):
            self._bring_up(name)
        self.supervise()

    def supervise(self) -> None:
        """Restart a worker that exited or stalled with work left (not while the broker is
        down: a worker only logs that it is ready once it reached the broker).
        """
        if "sweeper" not in self._up_at and not self.sweeper.is_running():
            self.sweeper.start()  # it died of something else than the chaos
            self.done["sweeper_restarts_unplanned"] += 1
        if "redis" in self._up_at:
            return
        try:
            work = self.work_left()
        except SQLAlchemyError:
            work = True
        for supervisor in self.workers.values():
            worker = supervisor.worker
            # Without work left nothing is stuck: a new value each time reads as progress.
            progress = _log_size(worker) if work else next(self._idle)
            try:
                supervisor.check(progress)
            except WorkerStartError:
                self.start_failures += 1

    def _disturb(self, name: str) -> None:
        if name == "child":
            worker = self.rng.choice(list(self.workers.values())).worker
            children = [pid for pid in worker.group_pids() if pid != worker.pid]
            if children:
                os.kill(self.rng.choice(children), signal.SIGKILL)
                self.done[name] += 1
        elif name == "worker":
            worker = self.rng.choice(list(self.workers.values())).worker
            if worker.is_running():
                worker.kill()
                self.done[name] += 1
        elif name not in self._up_at:
            self._take_down(name)
            self.done[name] += 1

    def _take_down(self, name: str) -> None:
        if name == "sweeper":
            self.sweeper.kill()
            self._up_at[name] = time.monotonic() + self.rng.uniform(*SWEEPER_DOWN)
            return
        server = self.redis if name == "redis" else self.postgres
        server.stop(mode=self.rng.choice(("terminate", "kill")))
        self._up_at[name] = time.monotonic() + self.rng.uniform(*OUTAGE)

    def _bring_up(self, name: str) -> None:
        del self._up_at[name]
        if name == "sweeper":
            self.sweeper.start()
        else:
            (self.redis if name == "redis" else self.postgres).start()

    def worker_restarts(self) -> int:
        """Workers started again, after a kill or a stall."""
        return sum(supervisor.restarts for supervisor in self.workers.values())


def _log_size(worker: WorkerProcess) -> int:
    try:
        return worker.log_path.stat().st_size
    except OSError:
        return 0
