"""Offload and onload of a model's tensors through host buffers allocated once.

`Offloader` is what parking a PyTorch model means here: every tensor that lives on the
model's device (parameters, and for a trainer the optimizer state) is copied into a
persistent host buffer, and the device copy is released by pointing the tensor's `.data`
at an empty tensor; activation allocates device storage again and copies back. The
Parameter objects themselves survive, so the optimizer's state mapping stays valid.

On CUDA the host buffers are pinned and allocated once per service (`cudaHostAlloc`
costs ~3 ms per tensor, pageable copies run ~10x slower), copies are issued with
`non_blocking=True` on a side stream, the stream is synchronised before the device
storage is dropped, and `torch.cuda.empty_cache()` returns the freed blocks to the
driver so that another process can use them.

Weights that arrive while offloaded (a weight sync into a parked rollout) are written
into the host buffers (`write_host`), never onto the device: the next `onload` copies
them up like any parked state. On CUDA that write is a host-to-host copy into pinned
memory; no kernel runs on the GPU until activation.

A dropped model (level-2 park) keeps no host copy either: `offload(keep_host_copy=False,
keep=...)` then `release_host(keep=...)` frees all but the buffers no weight import
refills; weights synced into it later get buffers again (`write_host(...,
allocate=True)`), and so does its next level-1 park (`refresh`), at the cost of
allocating pinned memory anew (~3 ms per tensor).

A service that hands its state to another copy of itself (`handoff.py`) frees both
copies: `offload(keep_host_copy=False)`, then `release_host()`; the tensors keep their
shapes, and `onload(restore=False)` gives them device storage again for the state to be
loaded into.

On CPU the "device" is just another set of tensors in the same RAM: the CPU path is a
stand-in that exercises the same protocol (buffers, copy, free, restore) for tests and
the demo; it frees nothing the machine would notice. The CUDA path ran on an H200 with
torch 2.11 (`tests/unit/worker/test_worker_cuda.py`, marked `gpu`; docs/benchmarks.md,
"On a GPU": 50-52 GB/s each way, 91-95% of the host link's rate).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable, Sequence

import torch

log = logging.getLogger(__name__)

#: torch's pinned-memory cache rounds each allocation up to a power of two (a 271 MB
#: weight took 512 MiB: a 7B trainer's parked state pinned 1.9x the 85 GiB the planner
#: counts); with this setting it allocates exactly above 1 MiB. Torch 2.11 does not
#: know the key, and its CUDA start then fails on it ("Unrecognized key ... in CUDA
#: allocator config", seen on an H200): `pin_exactly` applies it only where torch takes it.
PINNED_EXACT = "pinned_max_round_threshold_mb:1"
ALLOC_CONF_ENV = "PYTORCH_ALLOC_CONF"


def pin_exactly() -> bool:
    """Have torch pin parked state in blocks of its own size (`PINNED_EXACT`), here and
    in the processes this one starts (vLLM's engine: through `PYTORCH_ALLOC_CONF`);
    whether this torch took it. Where it does not know the setting, a warning says that
    parked state is pinned in power-of-two blocks (up to 2x what the planner counts),
    and nothing changes: set in the environment, such a torch could not start CUDA."""
    setter = getattr(torch._C, "_accelerator_setAllocatorSettings", None)
    try:
        if setter is None:
            raise RuntimeError("it has no allocator-settings call")
        setter(PINNED_EXACT)
    except (RuntimeError, ValueError) as exc:
        log.warning("torch %s does not take %s (%s): parked state is pinned in blocks "
                    "rounded up to a power of two, up to 2x the host memory the planner "
                    "counts for this service", torch.__version__, PINNED_EXACT, exc)
        return False
    current = os.environ.get(ALLOC_CONF_ENV, "")
    if PINNED_EXACT not in current.split(","):
        os.environ[ALLOC_CONF_ENV] = f"{current},{PINNED_EXACT}" if current else PINNED_EXACT
    return True


def on_index(device: torch.device) -> torch.device:
    """`cuda` as the `cuda:N` its tensors report (N the current device): a tensor made on
    `cuda` is on `cuda:N`, and `torch.device("cuda") != torch.device("cuda:0")`, so an
    equality test against a bare `cuda` matches no tensor."""
    if device.type == "cuda" and device.index is None:
        return torch.device("cuda", torch.cuda.current_device())
    return device


def is_dense(value: torch.Tensor) -> bool:
    """Whether `value` can be copied into a model's tensor as it is: strided, holding
    its values (not sparse, quantized, or a meta tensor without data)."""
    return value.layout is torch.strided and not value.is_quantized and not value.is_meta


class Offloader:
    """Moves a fixed set of device tensors to host buffers and back.

    The set is taken at construction: tensors created later (e.g. optimizer state made
    by the first step) need a new Offloader — `refresh()` rebuilds the set, keeping
    the buffers of tensors it already knows.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = on_index(device)  # compared with each tensor's own (`refresh`)
        self._tensors: list[torch.Tensor] = []
        self._host: dict[int, torch.Tensor] = {}  # id(tensor) -> host buffer
        self._shapes: dict[int, torch.Size] = {}
        self._valid: set[int] = set()  # host buffers holding the tensor's current value
        self.offloaded = False

    @property
    def cuda(self) -> bool:
        return self.device.type == "cuda"

    def refresh(self, tensors: Iterable[torch.Tensor]) -> None:
        """Track `tensors` (those on the device, non-empty); allocate missing buffers."""
        if self.offloaded:
            raise RuntimeError("cannot change the tracked tensors while offloaded")
        seen: set[int] = set()
        keep: list[torch.Tensor] = []
        for t in tensors:
            if id(t) in seen or t.device != self.device or t.numel() == 0:
                continue
            seen.add(id(t))
            keep.append(t)
            buf = self._host.get(id(t))
            if buf is None or buf.shape != t.shape or buf.dtype != t.dtype:
                # pin_memory only means something with CUDA; on CPU it would fail
                self._host[id(t)] = torch.empty(
                    t.shape, dtype=t.dtype, device="cpu", pin_memory=self.cuda
                )
        self._host = {k: v for k, v in self._host.items() if k in seen}
        self._tensors = keep

    def host_bytes(self) -> int:
        return sum(b.numel() * b.element_size() for b in self._host.values())

    def device_bytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self._tensors)

    def offload(self, keep_host_copy: bool = True, keep: Iterable[torch.Tensor] = ()) -> None:
        """Free the device copies; with `keep_host_copy` save them to the host first,
        without it save only those of `keep` (tracked tensors no weight import refills)."""
        if self.offloaded:
            return
        ids = {id(t) for t in keep}
        saved = (self._tensors if keep_host_copy
                 else [t for t in self._tensors if id(t) in ids])
        if saved:
            self._copy(saved, to_host=True)
        self._valid = {id(t) for t in saved}
        for t in self._tensors:
            self._shapes[id(t)] = t.shape
            t.data = torch.empty(0, dtype=t.dtype, device=self.device)
        self.offloaded = True
        if self.cuda:
            torch.cuda.empty_cache()

    def onload(self, restore: bool = True) -> None:
        """Reallocate device storage; with `restore` copy the host buffers back.

        Only buffers that hold a value are copied: all of them after `offload()`, none
        after `offload(keep_host_copy=False)` (a drop) except those `write_host` filled
        since. Tensors without a value (and all, without `restore`) hold zeros until
        weights are imported.
        """
        if not self.offloaded:
            return
        back = [t for t in self._tensors if id(t) in self._valid] if restore else []
        keep = {id(t) for t in back}
        try:
            for t in self._tensors:
                alloc = torch.empty if id(t) in keep else torch.zeros
                t.data = alloc(self._shapes[id(t)], dtype=t.dtype, device=self.device)
            self._copy(back, to_host=False)
        except BaseException:
            # e.g. out of device memory: give back what was allocated, stay offloaded
            # (the host buffers are untouched, so a later onload can try again)
            for t in self._tensors:
                t.data = torch.empty(0, dtype=t.dtype, device=self.device)
            if self.cuda:
                torch.cuda.empty_cache()
            raise
        self.offloaded = False

    def release_host(self, keep: Iterable[torch.Tensor] = ()) -> None:
        """While offloaded: free the host buffers too, but those of `keep` (tracked
        tensors no weight import refills); no copy of the rest is kept.

        `onload` then allocates zeros for the rest; `refresh` allocates the buffers
        again, and so does `write_host(..., allocate=True)` for the tensors it writes. On
        CUDA the freed pinned blocks are also returned from torch's host cache where it
        can.
        """
        if not self.offloaded:
            raise RuntimeError("release_host is for offloaded state; offload first")
        kept = {id(t) for t in keep}
        self._host = {k: b if k in kept else torch.empty(0, dtype=b.dtype)
                      for k, b in self._host.items()}
        self._valid &= kept
        if self.cuda:
            empty_host_cache = getattr(torch._C, "_host_emptyCache", None)
            if empty_host_cache is not None:
                empty_host_cache()

    def shape_of(self, tensor: torch.Tensor) -> torch.Size | None:
        """The shape `tensor` has on the device (also while offloaded); None if untracked."""
        if id(tensor) not in self._host:
            return None
        return self._shapes[id(tensor)] if self.offloaded else tensor.shape

    def write_host(self, values: Sequence[tuple[torch.Tensor, torch.Tensor]],
                   allocate: bool = False) -> None:
        """While offloaded: overwrite the host copies of tracked tensors with new values.

        Checks every pair before writing any (tracked, a dense value of the same
        shape), so a bad set leaves the parked state as it was. The device is not
        touched; `onload` brings them up. A released buffer (`release_host`) is
        refused, unless `allocate`: then it is allocated again (pinned on CUDA) for the
        value (weights synced into a dropped model, which holds no host copy).
        """
        if not self.offloaded:
            raise RuntimeError("write_host is for offloaded state; copy into the tensor")
        for t, value in values:
            if id(t) not in self._host:
                raise ValueError("tensor is not tracked by this offloader")
            if self._host[id(t)].shape != self._shapes[id(t)] and not allocate:
                raise ValueError("the host buffers were released (the state was handed off)")
            if value.shape != self._shapes[id(t)]:
                raise ValueError(f"shape {tuple(value.shape)} does not match the parked "
                                 f"tensor's {tuple(self._shapes[id(t)])}")
            if not is_dense(value):
                raise ValueError(f"a {value.layout} tensor{' (quantized)' * value.is_quantized}"
                                 " is not a dense tensor with its values")
        with torch.no_grad():
            for t, value in values:
                buf = self._host[id(t)]
                if buf.shape != self._shapes[id(t)]:
                    buf = self._host[id(t)] = torch.empty(
                        self._shapes[id(t)], dtype=t.dtype, device="cpu", pin_memory=self.cuda)
                buf.copy_(value)
                self._valid.add(id(t))

    def _copy(self, tensors: Sequence[torch.Tensor], to_host: bool) -> None:
        pairs = [(t, self._host[id(t)]) for t in tensors]
        if not pairs:
            return
        if not self.cuda:
            for t, buf in pairs:
                if to_host:
                    buf.copy_(t.data)
                else:
                    t.data.copy_(buf)
            return
        # A side stream lets the copies overlap other queued work; it must first wait
        # for whatever the default stream still has in flight on these tensors.
        stream = torch.cuda.Stream(device=self.device)  # type: ignore[no-untyped-call]
        stream.wait_stream(torch.cuda.current_stream(self.device))
        with torch.cuda.stream(stream):
            for t, buf in pairs:
                if to_host:
                    buf.copy_(t.data, non_blocking=True)
                else:
                    t.data.copy_(buf, non_blocking=True)
        stream.synchronize()
