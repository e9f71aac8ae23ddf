"""Parking a trainer on a real GPU: what it costs, beside the link's floor and the
simulator's model.

For trainers of several sizes (`WideLM`, fp32, Adam), on the `torch` backend exactly as a
service runs it (`TorchModelBackend`, `Offloader`: persistent pinned buffers, copies on
a side stream, `empty_cache`), it times:

- the first park (it also allocates the optimizer state's pinned buffers, which appear
  after the first step), then `--repeats` activate/park cycles (median);
- the floor: one pinned host tensor of the same bytes copied to and from one device
  tensor in one `copy_` each (median of `--repeats`): the host link's rate for one
  large transfer, which no per-tensor copy beats;
- what the simulator charges for moving that state (`slurmrl.sim.costs`: 1 s fixed plus
  bytes / 25 GB/s), and the measured switch (a park, then an activation of a copy of the
  same size: one job handing its GPU to another).

Each size runs in a process of its own. It reads, with NVML, the GPU memory the process
holds before and after the first park (what another process could use: the state, the
gradients a park drops and torch's cached blocks), and the pinned host bytes torch's
allocator took (`torch.cuda.host_memory_stats`) against the state's size: as a
worker does, it first asks torch for exact blocks (`offload.pin_exactly`; the JSON says
whether this torch took it); `--no-pin-exactly` leaves them rounded, to compare.

Prints a Markdown table and writes JSON to `--json`; asserts nothing. With `--device
cpu` (and small `--sizes`) it runs the same code on the CPU, as a check of the script
only: those figures are copies within RAM.

Usage: python benchmarks/park_cuda.py [--sizes 256,1024,2048] [--repeats 5]
       [--json out.json] [--device cuda] [--no-pin-exactly]
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import torch  # noqa: E402

from slurmrl.sim.costs import FIXED_SWITCH_S, PCIE_BPS  # noqa: E402
from slurmrl.worker.lm import WideLM  # noqa: E402
from slurmrl.worker.offload import pin_exactly  # noqa: E402
from slurmrl.worker.protocol import GenerateParams, Role, TrainSample  # noqa: E402
from slurmrl.worker.tiny import TinyBackend  # noqa: E402
from slurmrl.worker.torch_backend import TorchModelBackend  # noqa: E402

#: WideLM's width (a 14B model's hidden size; a layer's 105 MB is no power of two, so
#: torch's rounding of pinned blocks shows); its depth is chosen for the size asked
DIM = 5120


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def timed(device: torch.device, fn: Callable[[], object]) -> float:
    sync(device)
    t0 = time.perf_counter()
    fn()
    sync(device)
    return time.perf_counter() - t0


def batch() -> list[TrainSample]:
    roll = TinyBackend(Role.ROLLOUT)
    roll.load()
    samples = roll.generate(["1+2=", "30*4=", "9-7=", "5*5="],
                            GenerateParams(max_tokens=8, seed=1)).samples
    return [s.with_advantage(a) for s, a in zip(samples, (1.0, -0.5, 0.25, -0.75),
                                                strict=True)]


def trainer(layers: int, dim: int, device: str) -> TorchModelBackend:
    b = TorchModelBackend(Role.TRAINER, lambda: WideLM(dim, layers), device=device,
                          lr=1e-4, seed=0)
    b.load()
    b.train_step(batch())  # Adam's moments exist from here on
    return b


def floor(nbytes: int, device: torch.device, repeats: int) -> tuple[float, float]:
    """Median seconds of one device->host and one host->device copy of `nbytes`."""
    cuda = device.type == "cuda"
    host = torch.empty(nbytes, dtype=torch.uint8, pin_memory=cuda)
    dev = torch.empty(nbytes, dtype=torch.uint8, device=device)
    down = [timed(device, lambda: host.copy_(dev, non_blocking=cuda))
            for _ in range(repeats)]
    up = [timed(device, lambda: dev.copy_(host, non_blocking=cuda)) for _ in range(repeats)]
    return statistics.median(down), statistics.median(up)


def nvml_process_bytes() -> int | None:
    from slurmrl.gpu.nvml import NvmlMonitor, this_process_tree

    return NvmlMonitor().process_memory(this_process_tree())


def host_allocated() -> int | None:
    if not torch.cuda.is_available():
        return None
    read = getattr(torch.cuda, "host_memory_stats", None)  # newer torch only
    stats = read() if read is not None else {}
    got = stats.get("allocated_bytes.current")
    return None if got is None else int(got)


def measure(mparams: int, device: str, repeats: int, nvml: bool) -> dict[str, Any]:
    layers = max(1, round(mparams * 1e6 / (DIM * DIM)))
    b = trainer(layers, DIM, device)
    dev = b.device
    state = b.memory().device_bytes  # weights + Adam's two moments (grads are dropped)
    assert b._model is not None
    params = sum(int(p.numel()) for p in b._model.parameters())
    row: dict[str, Any] = {"params": params, "state_bytes": state}
    before = nvml_process_bytes() if nvml else None
    row["first_park_s"] = timed(dev, lambda: b.park(1))
    if nvml:
        after = nvml_process_bytes()
        row["nvml_freed_bytes"] = (None if before is None or after is None
                                   else before - after)
    row["pinned_allocated_bytes"] = host_allocated()
    row["host_bytes"] = b.memory().host_bytes
    acts, parks = [], []
    for _ in range(repeats):
        acts.append(timed(dev, b.activate))
        parks.append(timed(dev, lambda: b.park(1)))
    row["park_s"], row["activate_s"] = statistics.median(parks), statistics.median(acts)
    b.close()  # frees its GPU memory (empty_cache) before the floor's copies
    row["floor_down_s"], row["floor_up_s"] = floor(state, dev, repeats)
    row["sim_move_s"] = FIXED_SWITCH_S + state / PCIE_BPS
    return row


def gbps(nbytes: int, seconds: float) -> float:
    return nbytes / seconds / 1e9


def child(args: argparse.Namespace) -> None:
    """One size in this (fresh) process: its pinned-memory reading is its own."""
    exact = False if args.no_pin_exactly else pin_exactly()
    row = measure(args.one, args.device, args.repeats, nvml=args.device.startswith("cuda"))
    row["pin_exactly"] = exact
    print(json.dumps(row), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="256,1024,2048",
                    help="trainer sizes, millions of parameters (comma-separated)")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--no-pin-exactly", action="store_true",
                    help="leave torch's pinned blocks rounded (a worker asks for exact ones)")
    ap.add_argument("--one", type=int, default=None, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.one is not None:
        child(args)
        return
    device = args.device
    gpu = torch.cuda.get_device_name() if device.startswith("cuda") else "none (CPU)"
    info = {"gpu": gpu, "torch": torch.__version__, "python": platform.python_version(),
            "PYTORCH_ALLOC_CONF": os.environ.get("PYTORCH_ALLOC_CONF"),
            "host": platform.node(), "cpus": os.cpu_count()}
    print(json.dumps(info))
    rows = []
    for size in (int(s) for s in args.sizes.split(",")):
        # each size in a process of its own: torch keeps freed pinned blocks cached
        argv = [sys.executable, __file__, "--one", str(size), "--repeats",
                str(args.repeats), "--device", device]
        out = subprocess.run(argv + ["--no-pin-exactly"] * args.no_pin_exactly,
                             capture_output=True, text=True, check=True)
        sys.stderr.write(out.stderr)
        rows.append(json.loads(out.stdout.strip().splitlines()[-1]))
        print(json.dumps(rows[-1]), flush=True)
    print()
    print("| params | state (GB) | first park s | park s (GB/s) | activate s (GB/s) | "
          "floor down / up GB/s | switch s: measured / simulator | pinned host GB "
          "(x state) | NVML: GB given back |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        s = r["state_bytes"]
        pinned, freed = r["pinned_allocated_bytes"], r.get("nvml_freed_bytes")
        print(f"| {r['params'] / 1e6:.0f}M | {s / 1e9:.2f} | {r['first_park_s']:.3f} | "
              f"{r['park_s']:.3f} ({gbps(s, r['park_s']):.1f}) | "
              f"{r['activate_s']:.3f} ({gbps(s, r['activate_s']):.1f}) | "
              f"{gbps(s, r['floor_down_s']):.1f} / {gbps(s, r['floor_up_s']):.1f} | "
              f"{r['park_s'] + r['activate_s']:.3f} / {r['sim_move_s']:.3f} | "
              f"{'n/a' if pinned is None else f'{pinned / 1e9:.2f} ({pinned / s:.2f})'} | "
              f"{'n/a' if freed is None else f'{freed / 1e9:.2f}'} |")
    if args.json is not None:
        args.json.write_text(json.dumps({"info": info, "rows": rows}, indent=1))


if __name__ == "__main__":
    main()
