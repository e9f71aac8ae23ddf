"""A service is told its job's model in the step's environment
(`$SLURMRL_SERVICE_MODEL`), never in its argv: /proc/PID/cmdline is readable by every
user on the node, and the API keeps a job's model private to it (controller/views.py);
the step's environment only root and the job's user can read. The worker's command line
takes it from there."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from slurmrl.controller.services import ServiceSpec, UserIds, step_env, worker_argv
from slurmrl.worker.cli import worker

MODEL = "/models/alice/secret-finetune-7B"
MODEL_ENV = "SLURMRL_SERVICE_MODEL"  #: the controller's and the worker's name for it


def _argv(spec: ServiceSpec, tmp_path: Path) -> list[str]:
    ids = UserIds("someone", os.geteuid(), os.getegid(), "/home/someone")
    return worker_argv(spec, ids, python="/usr/bin/python3", workdir=tmp_path,
                       bind_host="0.0.0.0", advertise_host="node1")


@pytest.mark.parametrize(("backend", "role"), [("vllm", "rollout"), ("torch", "trainer")])
def test_the_model_is_in_the_steps_environment_not_its_argv(
        backend: str, role: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ServiceSpec(7, role, "someone", (0,), backend=backend, model=MODEL)
    argv = _argv(spec, tmp_path)
    assert "--model" not in argv and not any("secret-finetune" in a for a in argv)
    env = step_env(spec, "s" * 64, "c" * 64)
    assert env[MODEL_ENV] == MODEL
    # the worker's parser, given the launcher's arguments and the step's environment
    for k, v in env.items():
        monkeypatch.setenv(k, v)
    ctx = worker.make_context("worker", argv[argv.index("slurmrl.worker") + 1:])
    assert ctx.params["model"] == MODEL and ctx.params["backend_name"] == backend


def test_tiny_is_given_no_model(tmp_path: Path) -> None:
    spec = ServiceSpec(7, "rollout", "someone", (0,), backend="tiny", model=MODEL)
    assert MODEL_ENV not in step_env(spec, "s" * 64, "c" * 64)
    assert "--model" not in _argv(spec, tmp_path)
