"""Park/activate times of the `tiny` backend: in-process and through a real worker.

Prints (never asserts) p50/p95/max milliseconds over N cycles for a rollout and for a
trainer whose Adam state exists, first calling the backend directly, then over HTTP
through `ServiceHandle` against a `slurmrl worker` subprocess on loopback. On CPU a park
copies into host buffers in the same RAM: these figures measure the protocol's overhead,
not GPU<->host transfer (see docs for the GPU estimate: bytes / 25-50 GB/s).

Then, beside a plain park + activate of one copy, a window move of a floating pool: the
whole state going from one copy of the service to another through `hand_off` /
`take_over` and a file in /dev/shm, at `--dim` and at `--wide-dim` (tens of MB of
state), with the state's bytes and MB/s (1 MB = 10^6 bytes). In-process: two backend
objects. Over HTTP: two `slurmrl worker` subprocesses sharing one `--handoff-dir`; the
trainer copies run the `torch` backend on CPU with `TinyLM` at the width asked
(`bench_model` below), the rollout copies the `tiny` backend, whose width is fixed at
48, so the HTTP rollout runs at 48 only. On CPU both paths copy within the same RAM; the
move also writes and reads a file in tmpfs: these figures are the protocol and the copy
through node memory, not PCIe. "Across nodes": the two copies have a directory each, and
the one taking the state over fetches the file from the other (`activate` with
`source`, as a floating pool's copy on another node does), here over loopback: the
protocol and one more copy, not a network.

Usage: python benchmarks/park_activate.py [--cycles 50] [--dim 48] [--wide-dim 512]
       [--threads N]
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from torch import nn  # noqa: E402

from slurmrl.auth.tokens import mint_secret  # noqa: E402
from slurmrl.worker.handle import ServiceHandle  # noqa: E402
from slurmrl.worker.handoff import state_path  # noqa: E402
from slurmrl.worker.lm import TinyLM  # noqa: E402
from slurmrl.worker.protocol import GenerateParams, Role, TrainSample  # noqa: E402
from slurmrl.worker.tiny import TinyBackend  # noqa: E402

#: node-local shared memory, where a floating pool's handoff dir lives
SHM = Path("/dev/shm")
#: the width `bench_model` builds, set in the HTTP trainer workers' environment
DIM_ENV = "PARK_ACTIVATE_DIM"
#: the `tiny` backend's width (`make_backend` gives it no other)
TINY_DIM = 48


def bench_model() -> nn.Module:
    """`TinyLM` at the width in `$PARK_ACTIVATE_DIM`: the HTTP trainers' `--model`."""
    return TinyLM(dim=int(os.environ.get(DIM_ENV, TINY_DIM)))


def timed(fn: Callable[[], object], n: int) -> list[float]:
    out = []
    for _ in range(n):
        t0 = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t0) * 1e3)
    return out


def row(label: str, ms: list[float]) -> str:
    q = statistics.quantiles(ms, n=20)
    return f"{label:<34} p50 {statistics.median(ms):7.3f} ms  p95 {q[18]:7.3f} ms  " \
           f"max {max(ms):7.3f} ms"


def in_process(cycles: int, dim: int) -> None:
    roll = TinyBackend(Role.ROLLOUT, dim=dim)
    roll.load()
    out = roll.generate(["1+2=", "3*4="], GenerateParams())
    trainer = TinyBackend(Role.TRAINER, dim=dim)
    trainer.load()
    trainer.train_step([s.with_advantage(1.0) for s in out.samples])
    for name, b in (("rollout", roll), ("trainer", trainer)):
        park: list[float] = []
        act: list[float] = []
        for _ in range(cycles):
            park += timed(functools.partial(b.park, 1), 1)
            act += timed(b.activate, 1)
        print(f"in-process {name}: {b.memory().host_bytes} bytes parked")
        print(row("  park (level 1)", park))
        print(row("  activate", act))


@contextlib.contextmanager
def running_worker(tmp: Path, name: str, secret: str, role: Role, args: Sequence[str],
                   env_extra: dict[str, str] | None = None) -> Iterator[ServiceHandle]:
    """A `slurmrl worker` subprocess on loopback (job `bench`) and a handle to it;
    stopped on the way out, killed if it is still running whatever happened."""
    addr = tmp / f"{name}.addr"
    env = {**os.environ, "PYTHONPATH": str(REPO), "SLURMRL_JOB_SECRET": secret,
           **(env_extra or {})}
    proc = subprocess.Popen(
        [sys.executable, "-m", "slurmrl.worker", *args, "--role", str(role),
         "--job-id", "bench", "--host", "127.0.0.1", "--address-file", str(addr),
         "--log-level", "WARNING"],
        env=env, stdout=subprocess.DEVNULL)
    h: ServiceHandle | None = None
    try:
        while not addr.exists():
            if proc.poll() is not None:
                raise SystemExit(f"worker {name} failed to start")
            time.sleep(0.05)
        h = ServiceHandle(addr.read_text().strip(), secret, "bench", str(role))
        yield h
        h.stop()
        proc.wait(timeout=30)
    finally:
        if h is not None:
            h.close()
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def over_http(cycles: int) -> None:
    secret = mint_secret()
    with tempfile.TemporaryDirectory() as tmp, running_worker(
            Path(tmp), "worker", secret, Role.TRAINER, ["--backend", "tiny"]) as h:
        park: list[float] = []
        act: list[float] = []
        status: list[float] = []
        for _ in range(cycles):
            park += timed(lambda: h.park(1), 1)
            act += timed(h.activate, 1)
            status += timed(h.status, 1)
        print("over HTTP (signed, keep-alive) trainer:")
        print(row("  park (level 1)", park))
        print(row("  activate", act))
        print(row("  status (round-trip floor)", status))


# --- window moves: one copy's state to another copy through a file in /dev/shm ---------


def mb_s(nbytes: int, ms: list[float]) -> str:
    return f"{nbytes / (statistics.median(ms) / 1e3) / 1e6:8.1f} MB/s"


def report(where: str, role: str, dim: int, file_bytes: int, tensor_bytes: int,
           plain: tuple[list[float], list[float]],
           move: tuple[list[float], list[float]]) -> None:
    park, act = plain
    give, take = move
    print(f"{where} {role}, dim {dim}: state {file_bytes:,} bytes in the handoff file "
          f"({tensor_bytes:,} bytes of tensors)")
    print(row("  park (level 1)", park))
    print(row("  activate", act))
    print(row("  park + activate (one copy)", [p + a for p, a in zip(park, act, strict=True)]))
    print(row("  hand_off (write file, free)", give))
    print(row("  take_over (read file, load)", take))
    both = [g + t for g, t in zip(give, take, strict=True)]
    print(row("  window move (hand_off+take_over)", both))
    print(f"  handoff rate at p50: hand_off {mb_s(file_bytes, give)}, take_over "
          f"{mb_s(file_bytes, take)}, move {mb_s(file_bytes, both)}")


def move_in_process(role: Role, dim: int, cycles: int, tmp: Path,
                    samples: Sequence[TrainSample]) -> None:
    a, b = TinyBackend(role, dim=dim), TinyBackend(role, dim=dim)
    a.load()
    b.load()
    if role is Role.TRAINER:
        a.train_step(samples)  # Adam state exists from here on
    tensor_bytes = a.memory().device_bytes
    park: list[float] = []
    act: list[float] = []
    a.park(1)  # untimed: the first park allocates the host buffers
    a.activate()
    for _ in range(cycles):
        park += timed(functools.partial(a.park, 1), 1)
        act += timed(a.activate, 1)
    here = tmp / f"in-process-{role}-{dim}"  # a file per run: generations start at 0
    here.mkdir(mode=0o700)
    path = state_path(here, str(role))
    give: list[float] = []
    take: list[float] = []
    src, dst = a, b
    for k in range(cycles + 2):  # two untimed moves there and back first
        g = timed(functools.partial(src.hand_off, path), 1)
        t = timed(functools.partial(dst.take_over, path), 1)
        if k >= 2:
            give += g
            take += t
        src, dst = dst, src
    report("in-process", str(role), dim, path.stat().st_size, tensor_bytes,
           (park, act), (give, take))


def move_over_http(role: Role, dim: int, cycles: int, tmp: Path,
                   samples: Sequence[TrainSample], across: bool = False) -> None:
    """`across`: each copy with a directory of its own, as on two nodes; the taking copy
    fetches the file from the other over HTTP (`activate` with `source`), here over
    loopback."""
    secret = mint_secret()
    tag = "x" if across else ""
    handoff_dir = tmp / f"handoff-{role}-{dim}{tag}"
    if role is Role.TRAINER:
        args = ["--backend", "torch", "--device", "cpu", "--model",
                "benchmarks.park_activate:bench_model"]
    else:
        args = ["--backend", "tiny"]
    env = {DIM_ENV: str(dim)}
    with contextlib.ExitStack() as stack:
        a = stack.enter_context(running_worker(
            tmp, f"{role}-{dim}{tag}-a", secret, role,
            [*args, "--handoff-dir", str(handoff_dir) + ("-a" if across else "")], env))
        b = stack.enter_context(running_worker(
            tmp, f"{role}-{dim}{tag}-b", secret, role,
            [*args, "--handoff-dir", str(handoff_dir) + ("-b" if across else "")], env))
        if role is Role.TRAINER:
            a.train_step(samples)  # Adam state exists from here on
        tensor_bytes = int(a.status()["memory"]["device_bytes"])
        park: list[float] = []
        act: list[float] = []
        a.park(1)  # untimed: the first park allocates the host buffers
        a.activate()
        for _ in range(cycles):
            park += timed(lambda: a.park(1), 1)
            act += timed(a.activate, 1)
        give: list[float] = []
        take: list[float] = []
        src, dst = a, b
        for k in range(cycles + 2):  # two untimed moves there and back first
            g = timed(functools.partial(src.park, handoff=True), 1)
            t = timed(functools.partial(dst.activate, handoff=True,
                                        source=src.address if across else None), 1)
            if k >= 2:
                give += g
                take += t
            src, dst = dst, src
        file_bytes = state_path(Path(str(handoff_dir) + ("-a" if across else "")),
                                str(role)).stat().st_size
    report("over HTTP, across nodes (a fetch over loopback)" if across else "over HTTP",
           str(role), dim, file_bytes, tensor_bytes, (park, act), (give, take))


def window_moves(cycles: int, dims: Sequence[int]) -> None:
    shm = SHM if SHM.is_dir() else None
    print(f"window move: hand_off -> take_over between two copies, the file in "
          f"{shm or tempfile.gettempdir()}; beside park + activate of one copy")
    roll = TinyBackend(Role.ROLLOUT)
    roll.load()
    samples = [s.with_advantage(1.0)
               for s in roll.generate(["1+2=", "3*4="], GenerateParams()).samples]
    with tempfile.TemporaryDirectory(prefix="slurmrl-bench-", dir=shm) as name:
        tmp = Path(name)  # mode 0700, as a handoff dir must be
        for dim in dims:
            for role in (Role.ROLLOUT, Role.TRAINER):
                move_in_process(role, dim, cycles, tmp, samples)
        for dim in dims:
            for role in (Role.ROLLOUT, Role.TRAINER):
                if role is Role.ROLLOUT and dim != TINY_DIM:
                    print(f"over HTTP {role}, dim {dim}: not measured (the tiny backend's "
                          f"width is {TINY_DIM}; the torch backend has no rollout role)")
                    continue
                move_over_http(role, dim, cycles, tmp, samples)
                move_over_http(role, dim, cycles, tmp, samples, across=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    ap.add_argument("--cycles", type=int, default=50)
    ap.add_argument("--dim", type=int, default=48, help="TinyLM width (48: ~30k params)")
    ap.add_argument("--wide-dim", type=int, default=512,
                    help="second TinyLM width for the window move (512: ~3.2M params)")
    ap.add_argument("--threads", type=int, default=None,
                    help="torch threads here and in the workers (OMP_NUM_THREADS); default "
                         "torch's own. On a small shared machine 1 avoids waits for a core")
    args = ap.parse_args()
    # a plain kill would skip the clean-up (workers, temp dirs); exit through it instead
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))
    if args.threads is not None:
        os.environ["OMP_NUM_THREADS"] = str(args.threads)  # the workers inherit it
        __import__("torch").set_num_threads(args.threads)
    print(f"torch threads {__import__('torch').get_num_threads()}, cycles {args.cycles}")
    in_process(args.cycles, args.dim)
    over_http(args.cycles)
    window_moves(args.cycles, sorted({args.dim, args.wide_dim}))


if __name__ == "__main__":
    main()
