"""A floating pool's service copy is told where to hand its state off: the launcher's
argv carries `--handoff-dir`, and the worker's own command line accepts it."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurmrl.controller.services import ServiceSpec, UserIds, worker_argv
from slurmrl.worker.cli import worker

SHM = "/dev/shm/slurmrl-job7-0123456789abcdef"


def _argv(spec: ServiceSpec, tmp_path: Path) -> list[str]:
    ids = UserIds("someone", os.geteuid(), os.getegid(), "/home/someone")
    return worker_argv(spec, ids, python="/usr/bin/python3", workdir=tmp_path,
                       bind_host="0.0.0.0", advertise_host="node1")


def _worker_args(argv: list[str]) -> list[str]:
    """What `python -m slurmrl.worker` gets."""
    return argv[argv.index("slurmrl.worker") + 1:]


def test_a_copys_worker_is_given_its_handoff_dir(tmp_path: Path) -> None:
    spec = ServiceSpec(7, "trainer", "someone", (0, 1), backend="torch", handoff_dir=SHM)
    args = _worker_args(_argv(spec, tmp_path))
    assert args[args.index("--handoff-dir") + 1] == SHM
    # the worker knows the option: its parser takes the launcher's arguments as they are
    ctx = worker.make_context("worker", list(args))
    assert ctx.params["handoff_dir"] == Path(SHM) and ctx.params["role"] == "trainer"


def test_a_service_without_a_handoff_dir_gets_no_such_argument(tmp_path: Path) -> None:
    argv = _argv(ServiceSpec(7, "rollout", "someone", (0,)), tmp_path)
    assert "--handoff-dir" not in argv


@pytest.mark.parametrize("bad", ["", "slurmrl-job7", "shm/slurmrl-job7"])
def test_a_relative_handoff_dir_is_refused(bad: str) -> None:
    with pytest.raises(ValueError, match="handoff_dir must be an absolute path"):
        ServiceSpec(7, "rollout", "someone", (0,), handoff_dir=bad)
