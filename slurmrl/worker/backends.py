"""Backends by name: what `slurmrl worker --backend NAME` builds.

`vllm` is imported only when asked for, so the worker runs where vLLM is not installed.
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass
from typing import Any

from slurmrl.worker.protocol import BackendError, Role, ServiceBackend

BACKENDS = ("tiny", "torch", "vllm")


@dataclass(frozen=True)
class BackendOptions:
    """Everything a backend may need; each backend reads the fields it knows."""

    model: str | None = None  #: torch: "module:callable"; vllm: model name or path
    device: str = "cuda"
    seed: int = 0
    lr: float | None = None
    gpu_memory_utilization: float = 0.85
    #: vllm: the KV cache and the whole footprint per GPU the residency planner counts
    #: (`--kv-cache-bytes`, `--gpu-memory-bytes`; None: vLLM sizes them itself)
    kv_cache_bytes: int | None = None
    gpu_memory_bytes: int | None = None
    #: vllm: the GPUs one engine is split over (`--tensor-parallel-size`)
    tensor_parallel_size: int = 1


def load_factory(spec: str) -> Any:
    """Resolve "package.module:callable" to the callable, with a clear error."""
    module_name, sep, attr = spec.partition(":")
    if not sep or not module_name or not attr:
        raise BackendError(f"--model {spec!r} must look like package.module:callable")
    try:
        module = importlib.import_module(module_name)
    except ImportError as exc:
        raise BackendError(f"--model {spec!r}: cannot import {module_name}: {exc}") from exc
    factory = getattr(module, attr, None)
    if not callable(factory):
        raise BackendError(f"--model {spec!r}: {module_name} has no callable {attr!r}")
    return factory


def make_backend(name: str, role: Role, opts: BackendOptions) -> ServiceBackend:
    """Build (not load) the backend called `name`."""
    if name == "tiny":
        from slurmrl.worker.tiny import TinyBackend

        return TinyBackend(role, lr=3e-3 if opts.lr is None else opts.lr, seed=opts.seed)
    if name == "torch":
        from slurmrl.worker.torch_backend import TorchModelBackend

        if role is not Role.TRAINER:
            raise BackendError("the torch backend is a trainer; use vllm or tiny for rollout")
        factory = load_factory(opts.model or "slurmrl.worker.lm:TinyLM")
        return TorchModelBackend(role, factory, device=opts.device,
                                 lr=1e-5 if opts.lr is None else opts.lr, seed=opts.seed)
    if name == "vllm":
        from slurmrl.worker.vllm_backend import VllmBackend

        if role is not Role.ROLLOUT:
            raise BackendError("the vllm backend is a rollout engine; use torch for a trainer")
        if not opts.model:
            raise BackendError("the vllm backend needs --model (a model name or path)")
        return VllmBackend(
            opts.model, seed=opts.seed, gpu_memory_utilization=opts.gpu_memory_utilization,
            tensor_parallel_size=opts.tensor_parallel_size,
            kv_cache_bytes=opts.kv_cache_bytes, gpu_memory_bytes=opts.gpu_memory_bytes,
        )
    raise BackendError(f"unknown backend {name!r}; valid: {', '.join(BACKENDS)}")
