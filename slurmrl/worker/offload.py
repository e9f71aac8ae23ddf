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

On CPU the "device" is just another set of tensors in the same RAM: the CPU path is a
stand-in that exercises the same protocol (buffers, copy, free, restore) for tests and
the demo; it frees nothing the machine would notice. The CUDA path has not run on a GPU
in this project (no GPU on the development machine); its test is marked `gpu`.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch


class Offloader:
    """Moves a fixed set of device tensors to host buffers and back.

    The set is taken at construction: tensors created later (e.g. optimizer state made
    by the first step) need a new Offloader — `refresh()` rebuilds the set, keeping
    the buffers of tensors it already knows.
    """

    def __init__(self, device: torch.device) -> None:
        self.device = device
        self._tensors: list[torch.Tensor] = []
        self._host: dict[int, torch.Tensor] = {}  # id(tensor) -> host buffer
        self._shapes: dict[int, torch.Size] = {}
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

    def offload(self, keep_host_copy: bool = True) -> None:
        """Free the device copies; with `keep_host_copy` save them to the host first."""
        if self.offloaded:
            return
        if keep_host_copy:
            self._copy_all(to_host=True)
        for t in self._tensors:
            self._shapes[id(t)] = t.shape
            t.data = torch.empty(0, dtype=t.dtype, device=self.device)
        self.offloaded = True
        if self.cuda:
            torch.cuda.empty_cache()

    def onload(self, restore: bool = True) -> None:
        """Reallocate device storage; with `restore` copy the host buffers back.

        Without `restore` (after a drop) the device tensors hold zeros until weights are
        imported.
        """
        if not self.offloaded:
            return
        alloc = torch.empty if restore else torch.zeros
        for t in self._tensors:
            t.data = alloc(self._shapes[id(t)], dtype=t.dtype, device=self.device)
        if restore:
            self._copy_all(to_host=False)
        self.offloaded = False

    def _copy_all(self, to_host: bool) -> None:
        pairs = [(t, self._host[id(t)]) for t in self._tensors]
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
