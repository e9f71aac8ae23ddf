"""Park/activate times of the `tiny` backend: in-process and through a real worker.

Prints (never asserts) p50/p95/max milliseconds over N cycles for a rollout and for a
trainer whose Adam state exists, first calling the backend directly, then over HTTP
through `ServiceHandle` against a `slurmrl worker` subprocess on loopback. On CPU a park
copies into host buffers in the same RAM: these figures measure the protocol's overhead,
not GPU<->host transfer (see docs for the GPU estimate: bytes / 25-50 GB/s).

Usage: python benchmarks/park_activate.py [--cycles 50] [--dim 48]
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from slurmrl.auth.tokens import mint_secret  # noqa: E402
from slurmrl.worker.handle import ServiceHandle  # noqa: E402
from slurmrl.worker.protocol import GenerateParams, Role  # noqa: E402
from slurmrl.worker.tiny import TinyBackend  # noqa: E402


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
        park, act = [], []
        for _ in range(cycles):
            park += timed(lambda b=b: b.park(1), 1)
            act += timed(b.activate, 1)
        print(f"in-process {name}: {b.memory().host_bytes} bytes parked")
        print(row("  park (level 1)", park))
        print(row("  activate", act))


def over_http(cycles: int) -> None:
    secret = mint_secret()
    with tempfile.TemporaryDirectory() as tmp:
        addr = Path(tmp) / "addr"
        env = {**os.environ, "PYTHONPATH": str(REPO), "SLURMRL_JOB_SECRET": secret}
        proc = subprocess.Popen(
            [sys.executable, "-m", "slurmrl.worker", "--backend", "tiny", "--role", "trainer",
             "--job-id", "bench", "--host", "127.0.0.1", "--address-file", str(addr),
             "--log-level", "WARNING"],
            env=env, stdout=subprocess.DEVNULL)
        try:
            while not addr.exists():
                if proc.poll() is not None:
                    raise SystemExit("worker failed to start")
                time.sleep(0.05)
            h = ServiceHandle(addr.read_text().strip(), secret, "bench", "trainer")
            park, act, status = [], [], []
            for _ in range(cycles):
                park += timed(lambda: h.park(1), 1)
                act += timed(h.activate, 1)
                status += timed(h.status, 1)
            print("over HTTP (signed, keep-alive) trainer:")
            print(row("  park (level 1)", park))
            print(row("  activate", act))
            print(row("  status (round-trip floor)", status))
            h.stop()
            proc.wait(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cycles", type=int, default=50)
    ap.add_argument("--dim", type=int, default=48, help="TinyLM width (48: ~30k params)")
    args = ap.parse_args()
    print(f"torch threads {__import__('torch').get_num_threads()}, cycles {args.cycles}")
    in_process(args.cycles, args.dim)
    over_http(args.cycles)


if __name__ == "__main__":
    main()
