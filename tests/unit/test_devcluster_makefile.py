"""The Makefile's cluster recipe (`WITH_CLUSTER`, used by `make integration`/`make demo`)
holds one lock for the whole run, so two runs never share the dev cluster: a second
waits (and stops nothing while it waits), the lock goes with the recipe's shell on pass,
failure or SIGTERM, and no process it starts keeps it. Run on the recipe itself, through
a makefile that includes the project's, with a fake `slurmrl` and a lock in a temporary
directory: no Slurm, no venv, nothing installed."""

from __future__ import annotations

import contextlib
import fcntl
import os
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.skipif(not (shutil.which("make") and shutil.which("flock")),
                                reason="needs make and flock")

FAKE_SLURMRL = """#!/bin/bash
fd9=no; [ -e /proc/$$/fd/9 ] && fd9=yes
echo "slurmrl $* fd9=$fd9" >> {log}
if [ "$2" = up ]; then  # a daemon started by `up`: it inherits what `up` has open
  setsid sleep 120 </dev/null >/dev/null 2>&1 & echo $! >> {daemons}
fi
"""

# the recipe's command: says whether the lock is held, then passes, fails or hangs
PROBE = """#!/bin/bash
fd9=no; [ -e /proc/$$/fd/9 ] && fd9=yes
held=free; flock -n {lock} true || held=held
echo "probe $1 lock=$held fd9=$fd9 state=$SLURMRL_DEV_STATE" >> {log}
case $1 in hang) exec sleep 120;; *) exit "$1";; esac
"""


@dataclass
class Rig:
    dir: Path
    lock: Path
    log: Path
    daemons: Path

    def make(self, arg: str, *, lock_wait: int = 60) -> subprocess.Popen[str]:
        env = {k: v for k, v in os.environ.items()
               if k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL", "MAKEFILES")}
        return subprocess.Popen(
            ["make", "-s", "-f", str(self.dir / "probe.mk"), "_probe",
             f"SLURMRL={self.dir / 'slurmrl'}", f"STATE={self.dir / 'state'}",
             f"VENV={self.dir / 'venv'}", f"LOCK={self.lock}", f"LOCK_WAIT={lock_wait}",
             f"PROBE={self.dir / 'probe'} {arg}"],
            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
            start_new_session=True)

    def lines(self) -> list[str]:
        return self.log.read_text().splitlines() if self.log.exists() else []

    def lock_is_free(self) -> bool:
        with self.lock.open("a") as f:
            try:
                fcntl.flock(f, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                return False
            return True


@pytest.fixture
def rig(tmp_path: Path) -> Iterator[Rig]:
    r = Rig(tmp_path, tmp_path / "dev.lock", tmp_path / "log", tmp_path / "daemons")
    (tmp_path / "probe.mk").write_text(
        f"include {ROOT / 'Makefile'}\n_probe:\n\t@$(call WITH_CLUSTER,$(PROBE))\n")
    for name, text in (("slurmrl", FAKE_SLURMRL), ("probe", PROBE)):
        (tmp_path / name).write_text(text.format(log=r.log, daemons=r.daemons, lock=r.lock))
        (tmp_path / name).chmod(0o755)
    try:
        yield r
    finally:
        for pid in (r.daemons.read_text().split() if r.daemons.exists() else []):
            with contextlib.suppress(ProcessLookupError):
                os.kill(int(pid), signal.SIGKILL)


def _wait_for(pred: Callable[[], bool], what: str, timeout_s: float = 30.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert time.monotonic() < deadline, what
        time.sleep(0.05)


def _expected(rig: Rig, probe: str) -> list[str]:
    state = rig.dir / "state"
    return [f"slurmrl dev-cluster up --cancel-jobs --state-dir {state} fd9=no",
            f"probe {probe} lock=held fd9=no state={state}",
            f"slurmrl dev-cluster down --state-dir {state} fd9=no"]


@pytest.mark.parametrize(("probe", "ok"), [("0", True), ("3", False)])
def test_the_run_holds_the_lock_and_lets_it_go(rig: Rig, probe: str, ok: bool) -> None:
    proc = rig.make(probe)
    _, err = proc.communicate(timeout=60)
    assert (proc.returncode == 0) is ok, err
    assert rig.lines() == _expected(rig, probe)
    # the fake daemon `up` started is still running, and holds no lock
    assert rig.daemons.read_text().split()
    assert rig.lock_is_free()


def test_sigterm_stops_the_cluster_and_frees_the_lock(rig: Rig) -> None:
    proc = rig.make("hang")
    _wait_for(lambda: any(x.startswith("probe") for x in rig.lines()), "the run never started")
    os.killpg(proc.pid, signal.SIGTERM)  # what a CI timeout does
    proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert rig.lines() == _expected(rig, "hang")
    assert rig.lock_is_free()


def test_a_second_run_waits_and_stops_nothing_meanwhile(rig: Rig) -> None:
    with rig.lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)  # a first run, using the cluster
        proc = rig.make("0")
        assert proc.stderr is not None
        first = proc.stderr.readline()
        assert re.match(rf"make: waiting for {re.escape(str(rig.lock))}", first), first
        time.sleep(1.0)
        assert proc.poll() is None
        assert rig.lines() == []  # no `up`, above all no `down` under the first run
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 0, err
    assert rig.lines() == _expected(rig, "0")


def test_a_run_that_gives_up_waiting_stops_nothing(rig: Rig) -> None:
    with rig.lock.open("a") as held:
        fcntl.flock(held, fcntl.LOCK_EX)
        proc = rig.make("0", lock_wait=1)
        _, err = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "gave up" in err
    assert rig.lines() == []


@pytest.mark.parametrize("target", ["install", "$(STAMP)", "cluster-up", "cluster-down"])
def test_venv_and_cluster_recipes_take_the_lock(target: str) -> None:
    text = (ROOT / "Makefile").read_text()
    match = re.search(rf"^{re.escape(target)}:.*\n((?:\t.*\n)+)", text, re.M)
    assert match, target
    assert "$(TAKE_LOCK)" in match.group(1)
