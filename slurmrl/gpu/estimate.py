"""Model memory estimates for residency planning, before any GPU reading exists.

Rules (bytes per parameter, per GPU after sharding over `gpus`):
- rollout: weights at `dtype_bytes` (2 for bf16), plus a KV-cache budget (given, or by
  default as large as the weights and at least 1 GiB), plus a fixed per-GPU overhead for
  the CUDA context, CUDA graphs and NCCL buffers (1 GiB; vLLM never frees it).
  Parked at level 1 the weights sit in host memory; at level 2 nothing does.
- trainer: weights (2) + gradients (2) + Adam in mixed precision (fp32 master copy, m
  and v: 12) = 16 bytes per parameter, plus the same overhead. Parked, everything but
  the gradients sits in host memory (14 bytes per parameter).

Known limits: activations are not estimated (they depend on batch and sequence length;
pass them as `extra_bytes`); names are parsed for a size like "7B", "1.5b", "125M",
"30B-A3B" (total, not active, parameters); mixtures written "8x7B" are refused.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

GiB = 1 << 30
OVERHEAD_BYTES = GiB
#: parameters of the `tiny` backend's TinyLM (dim 48, vocab 18), for plans in tests
TINY_PARAMS = 29_970

_SIZE = re.compile(r"(?<![\w.])(\d+(?:\.\d+)?)([kmbt])(?![a-z0-9])", re.IGNORECASE)
_UNIT = {"k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


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
    return int(float(match.group(1)) * _UNIT[match.group(2).lower()])


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
