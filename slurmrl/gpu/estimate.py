"""Model memory estimates for residency planning, before any GPU reading exists.

Rules (bytes per parameter, per GPU after sharding over `gpus`):
- rollout: weights at `dtype_bytes` (2 for bf16), plus a KV-cache budget (given, or by
  default as large as the weights and at least 1 GiB), plus a fixed per-GPU overhead for
  the CUDA context, CUDA graphs and NCCL buffers (1 GiB; vLLM never frees it).
  Parked at level 1 the weights sit in host memory; at level 2 nothing does.
- trainer: weights (2) + gradients (2) + Adam in mixed precision (fp32 master copy, m
  and v: 12) = 16 bytes per parameter, plus the same overhead. Parked, everything but
  the gradients sits in host memory (14 bytes per parameter).

The same rules size what a service is launched with, so the planner and the engine
agree: `rollout_budget` is the GPU memory per GPU the planner counts for a rollout and
the KV cache the `vllm` backend is told to allocate (vLLM's `kv_cache_memory_bytes`),
and `weights_body_bytes` the largest weights upload (`PUT /v1/weights`, the whole
state_dict) a service of the model must accept.

Known limits: activations are not estimated (they depend on batch and sequence length;
pass them as `extra_bytes`); names are parsed for a size like "7B", "1.5b", "125M",
"30B-A3B" (total, not active, parameters: `active_param_count` reads the active ones),
never "4k" (a context length); mixtures written "8x7B" are refused. The 1 GiB overhead
is a small model's on one GPU: with tensor parallelism the CUDA graphs and NCCL buffers
can take up to ~7 GiB per GPU (shared/research/resident-models.md), which this does not
count; such jobs should declare `--rl-mem`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GiB = 1 << 30
OVERHEAD_BYTES = GiB
#: parameters of the `tiny` backend's TinyLM (dim 48, vocab 18), for plans in tests
TINY_PARAMS = 29_970

#: a size in millions, billions or trillions: no language model has thousands of
#: parameters, and a "4k" or "128k" in a name is its context length (Phi-3-mini-4k)
_SIZE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)([mbt])(?![a-z0-9])", re.IGNORECASE)
_UNIT = {"m": 1e6, "b": 1e9, "t": 1e12}


def parse_param_count(model: str | int) -> int:
    """Parameters of `model`: an int, "tiny", or a name carrying its size ("Qwen2.5-7B")."""
    if isinstance(model, int):
        if model <= 0:
            raise ValueError(f"parameter count must be > 0, got {model}")
        return model
    if model.strip().lower() == "tiny":
        return TINY_PARAMS
    match = _SIZE.search(model.rsplit("/", 1)[-1])
    if match is None:
        raise ValueError(
            f"cannot infer the parameter count of model {model!r}: give a number of "
            "parameters or a name with a size such as '7B' (or declare --rl-mem)"
        )
    return _count(match)


def _count(match: re.Match[str]) -> int:
    """The parameters a `_SIZE` or `_ACTIVE` match names."""
    return int(float(match.group(1)) * _UNIT[match.group(2).lower()])


#: a mixture of experts' active parameters in its name: "Qwen3-30B-A3B" (3B of 30B)
_ACTIVE = re.compile(r"(?<=[-_])A(\d+(?:\.\d+)?)([mbt])(?![a-z0-9])", re.IGNORECASE)


def active_param_count(model: str | int) -> int:
    """Parameters each token passes through: a mixture of experts' active ones where
    its name gives them ("Qwen3-30B-A3B": 3B), else all of them (`parse_param_count`)."""
    if isinstance(model, str):
        match = _ACTIVE.search(model.rsplit("/", 1)[-1])
        if match is not None:
            return _count(match)
    return parse_param_count(model)


@dataclass(frozen=True)
class MemoryEstimate:
    """Estimated memory of one service, per GPU; `*_bytes` are bytes."""

    role: str
    params: int
    gpus: int
    weights_bytes: int
    grads_bytes: int
    optimizer_bytes: int
    kv_cache_bytes: int
    overhead_bytes: int
    extra_bytes: int

    @property
    def device_bytes(self) -> int:
        """GPU memory per GPU while active."""
        return (self.weights_bytes + self.grads_bytes + self.optimizer_bytes
                + self.kv_cache_bytes + self.overhead_bytes + self.extra_bytes)

    def parked_device_bytes(self) -> int:
        """GPU memory per GPU that parking cannot free (context, graphs, NCCL)."""
        return self.overhead_bytes

    def parked_host_bytes(self, level: int = 1) -> int:
        """Host memory per GPU the parked state takes (level 2 drops the weights)."""
        if level == 2:
            if self.role == "trainer":
                raise ValueError("a trainer cannot be parked at level 2")
            return 0
        return self.weights_bytes + self.optimizer_bytes


def estimate_model_memory(
    model: str | int,
    role: str,
    *,
    gpus: int = 1,
    dtype_bytes: int = 2,
    kv_cache_bytes: int | None = None,
    extra_bytes: int = 0,
) -> MemoryEstimate:
    """Estimate a `rollout` or `trainer` service of `model` sharded over `gpus` GPUs."""
    if role not in ("rollout", "trainer"):
        raise ValueError(f"role must be 'rollout' or 'trainer', got {role!r}")
    if gpus < 1:
        raise ValueError(f"gpus must be >= 1, got {gpus}")
    if dtype_bytes not in (1, 2, 4):
        raise ValueError(f"dtype_bytes must be 1, 2 or 4, got {dtype_bytes}")
    params = parse_param_count(model)
    per_gpu = -(-params // gpus)
    weights = per_gpu * dtype_bytes
    if role == "trainer":
        return MemoryEstimate(role, params, gpus, weights, per_gpu * dtype_bytes,
                              per_gpu * 12, 0, OVERHEAD_BYTES, extra_bytes)
    kv = kv_cache_bytes if kv_cache_bytes is not None else max(weights, GiB)
    if kv < 0:
        raise ValueError(f"kv_cache_bytes must be >= 0, got {kv}")
    return MemoryEstimate(role, params, gpus, weights, 0, 0, kv, OVERHEAD_BYTES, extra_bytes)


#: the widest dtype a weights upload carries: a trainer's state_dict may hold its
#: parameters in fp32 (the model a `torch` factory builds), whatever the rollout serves
BLOB_DTYPE_BYTES = 4
#: a torch.save'd state_dict's own bytes besides the tensors' (names, zip headers)
BLOB_OVERHEAD_BYTES = 64 << 20


@dataclass(frozen=True)
class RolloutBudget:
    """What the residency planner counts for one rollout engine, per GPU: its GPU memory
    while active, and the part of it for the KV cache (None where the weights' size is
    unknown: a `--rl-mem` job of a model without a size in its name)."""

    device_bytes: int
    kv_cache_bytes: int | None


def rollout_budget(model: str | int | None, *, gpus: int = 1,
                   mem_bytes: int | None = None) -> RolloutBudget:
    """A rollout of `model` over `gpus` GPUs, as `residency.footprints_for_job` plans it:
    a declared `mem_bytes` (`--rl-mem`, per GPU) is the whole footprint and the KV cache
    what is left of it after the weights and the overhead; else the estimate (weights,
    KV as large as the weights and at least 1 GiB, overhead). ValueError for a model it
    cannot size without `mem_bytes`."""
    try:
        est = None if model is None else estimate_model_memory(model, "rollout", gpus=gpus)
    except ValueError:
        if mem_bytes is None:
            raise
        est = None
    if mem_bytes is None:
        if est is None:
            raise ValueError("a rollout of no named model needs a declared --rl-mem")
        return RolloutBudget(est.device_bytes, est.kv_cache_bytes)
    kv = None if est is None else mem_bytes - est.weights_bytes - est.overhead_bytes
    return RolloutBudget(mem_bytes, kv if kv is not None and kv > 0 else None)


def weights_body_bytes(model: str | int | None, *, gpus: int = 1,
                       mem_bytes: int | None = None) -> int | None:
    """The largest weights upload a service of `model` must take: its whole state_dict
    (every GPU's shard) at `BLOB_DTYPE_BYTES` per parameter, plus an eighth and
    `BLOB_OVERHEAD_BYTES`. For a model without a size in its name, a declared `mem_bytes`
    per GPU bounds it (weights at 2 bytes per parameter fit in it on `gpus` GPUs); None
    where neither tells."""
    try:
        params: int | None = None if model is None else parse_param_count(model)
    except ValueError:
        params = None
    if params is None and mem_bytes is not None:
        params = mem_bytes * gpus // 2
    if params is None:
        return None
    tensors = params * BLOB_DTYPE_BYTES
    return tensors + tensors // 8 + BLOB_OVERHEAD_BYTES
