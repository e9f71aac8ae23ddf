"""A service is launched sized from its job's model: its worker takes a weights upload
of the whole state_dict (a model over 1 GiB was refused with 413), and a `vllm` rollout
is told the GPU memory the residency planner counts for it (it took 85% of the GPU).

The worker is run as far as the server it would listen with (its command line, as the
launcher builds it, parsed by the worker's own parser, and the request-size limit of
the `ServiceServer` that makes): no GPU, no vLLM and no multi-GiB upload here."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from slurmrl.auth.tokens import mint_secret
from slurmrl.controller.residency import footprints_for_job
from slurmrl.controller.services import (
    GPU_MEMORY_ENV,
    KV_CACHE_ENV,
    MAX_BODY_ENV,
    TP_ENV,
    ServiceSpec,
    UserIds,
    sizing_env,
    step_env,
    worker_argv,
)
from slurmrl.gpu.estimate import GiB
from slurmrl.model import Layout, RlRequest
from slurmrl.worker import server as worker_server
from slurmrl.worker.cli import worker


def _worker_args(spec: ServiceSpec, tmp_path: Path) -> list[str]:
    ids = UserIds("someone", os.geteuid(), os.getegid(), "/home/someone")
    argv = worker_argv(spec, ids, python="/usr/bin/python3", workdir=tmp_path,
                       bind_host="127.0.0.1", advertise_host="node1")
    return argv[argv.index("slurmrl.worker") + 1:]


def _served_limit(spec: ServiceSpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """The request-size limit of the server the worker would listen with, given the
    launcher's arguments and the step's environment (the model comes in the latter)."""
    args = _worker_args(spec, tmp_path)
    seen: dict[str, Any] = {}

    async def serve(server: Any, *a: Any, **k: Any) -> None:
        seen["server"] = server

    monkeypatch.setattr(worker_server, "serve", serve)
    # no engine is started: vLLM would only load in serve (as the tiny model does)
    result = CliRunner().invoke(worker, [a for a in args if a != "--address-file"
                                         and not a.endswith("/address")],
                                env=step_env(spec, mint_secret(), mint_secret()))
    assert result.exit_code == 0, result.output
    # what aiohttp refuses a body over (413): the limit the server was built with
    return int(seen["server"].app()._client_max_size)


@pytest.mark.parametrize(("model", "params"), [("Qwen/Qwen2.5-1.5B", 1.5e9),
                                               ("Qwen2.5-7B", 7e9)])
def test_a_rollout_takes_a_weights_upload_of_its_whole_model(
        model: str, params: float, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    spec = ServiceSpec(7, "rollout", "someone", (0,), backend="vllm", model=model)
    limit = _served_limit(spec, tmp_path, monkeypatch)
    # the state_dict in bf16 is over the old 1 GiB limit; even in fp32 it fits now
    assert params * 2 > GiB
    assert limit >= params * 4 + (64 << 20)


def test_a_torch_trainer_is_sized_the_same() -> None:
    spec = ServiceSpec(7, "trainer", "someone", (0, 1), backend="torch", model="Qwen2.5-7B")
    env = sizing_env(spec)
    assert int(env[MAX_BODY_ENV]) << 20 >= 7e9 * 4
    assert GPU_MEMORY_ENV not in env  # a trainer is no vLLM engine


def test_a_model_sized_only_by_its_rl_mem_is_bounded_by_it() -> None:
    spec = ServiceSpec(7, "rollout", "someone", (0, 1), backend="vllm",
                       model="/models/house-model", mem_bytes=20 * GiB)
    env = sizing_env(spec)
    # weights at 2 bytes per parameter fit 2 x 20 GiB: <= 20 Gi parameters, 80 GiB in fp32
    assert int(env[MAX_BODY_ENV]) << 20 >= 80 * GiB
    # the engine gets the declared footprint; its KV cache vLLM sizes (weights unknown)
    assert env[GPU_MEMORY_ENV] == str(20 * GiB)
    assert KV_CACHE_ENV not in env


def test_a_vllm_rollout_over_several_gpus_is_split_over_them(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    one, two = (ServiceSpec(7, "rollout", "someone", gpus, backend="vllm", model="Qwen2.5-7B")
                for gpus in ((0,), (0, 1)))
    trainer = ServiceSpec(7, "trainer", "someone", (0, 1), backend="torch", model="Qwen2.5-7B")
    assert TP_ENV not in sizing_env(one) and TP_ENV not in sizing_env(trainer)
    assert sizing_env(two)[TP_ENV] == "2"
    # the worker the launcher starts builds its engine so (no engine starts: no vLLM)
    seen: dict[str, Any] = {}

    async def serve(server: Any, *a: Any, **k: Any) -> None:
        seen["backend"] = server.backend

    monkeypatch.setattr(worker_server, "serve", serve)
    args = [a for a in _worker_args(two, tmp_path) if a != "--address-file"
            and not a.endswith("/address")]
    result = CliRunner().invoke(worker, args, env=step_env(two, mint_secret(), mint_secret()))
    assert result.exit_code == 0, result.output
    assert seen["backend"]._tp == 2


def test_tiny_serves_its_own_model_whatever_the_job_names() -> None:
    spec = ServiceSpec(7, "rollout", "someone", (0,), model="Qwen2.5-72B")
    assert sizing_env(spec) == {}


def test_a_services_size_is_not_in_its_command_line(tmp_path: Path) -> None:
    # argv is readable by every user on the node (/proc): --max-body-mb and the vLLM
    # memory flags there told other users how large a job's model is
    spec = ServiceSpec(7, "rollout", "someone", (0, 1), backend="vllm", model="Qwen2.5-32B")
    args = _worker_args(spec, tmp_path)
    assert not any(a.startswith(("--max-body-mb", "--gpu-memory-bytes", "--kv-cache-bytes"))
                   for a in args)
    assert not any(str(v) in args for v in sizing_env(spec).values())
    env = step_env(spec, mint_secret(), mint_secret())
    assert {MAX_BODY_ENV, GPU_MEMORY_ENV, KV_CACHE_ENV} <= set(env)


@pytest.mark.parametrize(("request_", "replica_gpus"), [
    (RlRequest(gpus=1, model="Qwen/Qwen2.5-1.5B"), 0),
    (RlRequest(gpus=4, model="Qwen2.5-32B"), 0),
    (RlRequest(gpus=4, model="Qwen2.5-7B"), 1),
    (RlRequest(gpus=2, model="Qwen2.5-7B", mem_bytes=40 * GiB), 0),
    (RlRequest(gpus=4, model="Qwen2.5-7B", layout=Layout.DISAGGREGATED, rollout_gpus=1), 0),
])
def test_a_vllm_rollout_is_launched_with_the_footprint_the_planner_counts(
        request_: RlRequest, replica_gpus: int, tmp_path: Path) -> None:
    for fp in footprints_for_job(3, request_, list(range(request_.gpus)), replica_gpus):
        if fp.role != "rollout":
            continue
        spec = ServiceSpec(3, "rollout", "someone", tuple(sorted(fp.gpus)), backend="vllm",
                           model=request_.model, replica=fp.replica,
                           mem_bytes=request_.mem_bytes)
        env = sizing_env(spec)
        assert int(env[GPU_MEMORY_ENV]) == fp.active_bytes
        kv = int(env[KV_CACHE_ENV])
        # the KV cache is the footprint less the weights and the CUDA context/graphs
        assert 0 < kv < fp.active_bytes


def test_a_services_environment_holds_no_allocator_setting_its_torch_may_refuse() -> None:
    # PYTORCH_ALLOC_CONF=pinned_max_round_threshold_mb:1 in the step's environment made
    # torch 2.11's CUDA start fail ("Unrecognized key"): every torch and vLLM service
    # on such a node died at launch. The worker applies it itself where torch takes it.
    for backend in ("torch", "vllm", "tiny"):
        spec = ServiceSpec(7, "trainer", "someone", (0,), backend=backend, model="m-7B")
        env = step_env(spec, mint_secret(), mint_secret())
        assert "PYTORCH_ALLOC_CONF" not in env and "PYTORCH_CUDA_ALLOC_CONF" not in env
