"""A floating pool's service copy is told where to hand its state off: in the step's
environment (`$SLURMRL_HANDOFF_DIR`, as its secrets), never in its argv, which any user
can read in /proc (and then create the directory first: the worker refuses one it does
not own, and the job's placement fails); the worker's command line takes it from there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurmrl.controller.services import HANDOFF_ENV, ServiceSpec, UserIds, step_env, worker_argv
from slurmrl.worker.cli import worker

SHM = "/dev/shm/slurmrl-job7-0123456789abcdef"


def _argv(spec: ServiceSpec, tmp_path: Path) -> list[str]:
    ids = UserIds("someone", os.geteuid(), os.getegid(), "/home/someone")
    return worker_argv(spec, ids, python="/usr/bin/python3", workdir=tmp_path,
                       bind_host="0.0.0.0", advertise_host="node1")


def _worker_args(argv: list[str]) -> list[str]:
    """What `python -m slurmrl.worker` gets."""
    return argv[argv.index("slurmrl.worker") + 1:]


def test_a_copys_worker_is_given_its_handoff_dir_in_its_environment_only(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ServiceSpec(7, "trainer", "someone", (0, 1), backend="torch", handoff_dir=SHM)
    argv = _argv(spec, tmp_path)
    assert not any(SHM in a for a in argv) and "--handoff-dir" not in argv
    env = step_env(spec, "s" * 64, "c" * 64)
    assert env[HANDOFF_ENV] == SHM
    # the worker takes it from there: its parser, given the launcher's arguments as
    # they are and the step's environment
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    ctx = worker.make_context("worker", list(_worker_args(argv)))
    assert ctx.params["handoff_dir"] == Path(SHM) and ctx.params["role"] == "trainer"


def test_a_service_without_a_handoff_dir_gets_none(tmp_path: Path) -> None:
    spec = ServiceSpec(7, "rollout", "someone", (0,))
    assert "--handoff-dir" not in _argv(spec, tmp_path)
    assert HANDOFF_ENV not in step_env(spec, "s" * 64, "c" * 64)


@pytest.mark.parametrize("bad", ["", "slurmrl-job7", "shm/slurmrl-job7"])
def test_a_relative_handoff_dir_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="handoff_dir must be an absolute path"):
        ServiceSpec(7, "rollout", "someone", (0,), handoff_dir=bad)
