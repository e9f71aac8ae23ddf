"""The dev cluster's `down` finds the step daemons its slurmd left and kills them with
their tasks. Real processes, no Slurm: a shell script named `slurmstepd` (its /proc comm
is its name) that starts a task, run with one cluster's `SLURM_CONF` or another's."""

from __future__ import annotations

import os
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from slurmrl.devcluster import daemons


def _alive(pid: int) -> bool:
    return daemons.process_name(pid) is not None


@pytest.fixture
def stepd(tmp_path: Path) -> Iterator[Path]:
    """A `slurmstepd` that starts a task (`sleep`) and waits for it; its pid and the
    task's are written to the file named in its first argument."""
    script = tmp_path / "slurmstepd"
    script.write_text('#!/bin/sh\nsleep 300 &\necho "$$ $!" > "$1"\nwait\n')
    script.chmod(0o755)
    yield script


def _start(script: Path, conf: str, out: Path) -> tuple[subprocess.Popen[bytes], int]:
    proc = subprocess.Popen([str(script), str(out)], env={"PATH": os.environ["PATH"],
                                                          "SLURM_CONF": conf})
    deadline = time.monotonic() + 10
    while not (out.exists() and len(out.read_text().split()) == 2):
        assert time.monotonic() < deadline, "the fake slurmstepd did not start its task"
        time.sleep(0.02)
    return proc, int(out.read_text().split()[1])


def test_only_this_clusters_step_daemons_are_found_and_killed_with_their_tasks(
        stepd: Path, tmp_path: Path) -> None:
    ours, theirs = tmp_path / "ours" / "slurm.conf", "/etc/slurm/slurm.conf"
    mine, my_task = _start(stepd, str(ours), tmp_path / "a")
    other, other_task = _start(stepd, theirs, tmp_path / "b")
    try:
        assert daemons.step_daemons(ours) == [mine.pid]
        daemons.kill_trees([mine.pid])
        mine.wait(5)
        time.sleep(0.1)
        assert not _alive(my_task)  # the task went with its step daemon
        assert _alive(other.pid) and _alive(other_task)  # another cluster's stays
        assert daemons.step_daemons(ours) == []
    finally:
        for p in (my_task, other_task):
            if _alive(p):
                os.kill(p, 9)
        for proc in (mine, other):
            proc.kill()
            proc.wait(5)
