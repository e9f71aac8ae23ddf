"""Run the four reference RLVR jobs on the local Slurm under a fresh controller, and measure.

Used by `make demo` (examples/demo.py) and benchmarks/e2e.py. One `run()`:

1. writes a site config (dev cluster's `pools` partition, DB under the run dir) and
   starts `slurmrl controller --pool-manager slurm` as root on a free port;
2. submits the jobs in examples/jobs/ as their users (`runuser -u USER -- sbatch ...`,
   what a user types), adding `--rl-mux=off` for the dedicated baseline;
3. calls `tick()` every few seconds while they run (the demo shows `slurmrl status`);
4. waits for every job to end, stops the controller (always), cancels whatever of its
   Slurm jobs is left, and returns a `RunResult` read from the controller's DB.

GPU-seconds here are what Slurm allocated to the pools (GPUs x how long each pool
ran): what a site pays. The controller's ledger (leased GPU-seconds) is in the report.

Known limits: submits with the Slurm commands directly (this is an example of what a
user does, not product code); needs root (runuser, a root-owned controller).
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

VENV = Path(os.environ.get("SLURMRL_VENV", "/opt/slurmrl/venv"))
PYTHON = str(VENV / "bin" / "python")
SLURMRL = str(VENV / "bin" / "slurmrl")
HERE = Path(__file__).resolve().parent

#: (script in examples/jobs, user): the demo's four jobs of two users
JOBS: tuple[tuple[str, str], ...] = (
    ("math", "rlalice"), ("agentic", "rlbob"),
    ("math-big", "rlbob"), ("agentic-small", "rlalice"),
)
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "PREEMPTED",
            "OUT_OF_MEMORY", "BOOT_FAIL", "DEADLINE"}


def _end_with_parent() -> None:
    """In the controller's child, before exec: it gets SIGTERM when the process that
    started it dies, whatever killed that (PR_SET_PDEATHSIG; no controller outlives a
    run)."""
    import ctypes

    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGTERM)  # PR_SET_PDEATHSIG = 1


class RunError(RuntimeError):
    """The run did not complete; the message says which job and why."""


@dataclass
class JobResult:
    name: str
    user: str
    slurm_job_id: int
    state: str
    rewards: list[float]
    wall_s: float  #: driver wall time from the `done` line (nan if it never finished)
    pool_id: int | None = None
    output: Path | None = None

    @property
    def reward_first(self) -> float:
        """The mean reward of the first quarter of the steps (10 at most): never the
        same steps as `reward_last`, however few the steps (`DEMO_STEPS`)."""
        xs = self.rewards[:self._window]
        return sum(xs) / len(xs) if xs else float("nan")

    @property
    def reward_last(self) -> float:
        xs = self.rewards[-self._window:] if self._window else []
        return sum(xs) / len(xs) if xs else float("nan")

    @property
    def _window(self) -> int:
        n = len(self.rewards)
        return max(1, min(10, n // 4)) if n > 1 else 0


@dataclass
class RunResult:
    label: str
    mux: str
    db: Path
    jobs: list[JobResult]
    makespan_s: float
    pool_gpu_s: float  #: GPUs x open time of every pool (what Slurm allocated)
    leased_gpu_s: float  #: the controller's ledger: GPU-seconds granted to leases
    pools: int
    extra: dict[str, Any] = field(default_factory=dict)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def slurm_env(state_dir: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SLURMRL_")}
    env["SLURM_CONF"] = str(state_dir / "etc" / "slurm.conf")
    env["OMP_NUM_THREADS"] = "1"  # services inherit it through srun: 2 cores, 8 services
    return env


def write_site_config(path: Path, port: int, db: Path, slurm_conf: str,
                      floating: bool = False) -> None:
    """`floating`: pools may float (up to 4 jobs a pool, so the four jobs may share)."""
    most = 4 if floating else 2
    path.write_text(f"""# written by examples/e2e_run.py for one run on the dev cluster
[controller]
host = "127.0.0.1"
port = {port}
db_path = "{db}"
heartbeat_s = 1.0
lease_timeout_s = 15.0
reconcile_interval_s = 2.0

[slurm]
pool_partition = "pools"
slurm_conf = "{slurm_conf}"
floating_pools = {"true" if floating else "false"}

[limits]
max_jobs_per_pool = {most}
""")


class Controller:
    """`slurmrl controller` as a child process; `stop()` is safe to call twice."""

    def __init__(self, run_dir: Path, env: dict[str, str], floating: bool = False) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.db = run_dir / "controller.db"
        self.config = run_dir / "slurmrl.toml"
        self.log = run_dir / "controller.log"
        write_site_config(self.config, self.port, self.db, env["SLURM_CONF"], floating)
        self.env = dict(env)
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self, timeout_s: float = 30.0) -> None:
        import urllib.request

        with self.log.open("ab") as out:
            self.proc = subprocess.Popen(
                [SLURMRL, "controller", "--config", str(self.config), "--pool-manager",
                 "slurm"], env=self.env, stdout=out, stderr=subprocess.STDOUT,
                preexec_fn=_end_with_parent)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RunError(f"the controller exited ({self.proc.returncode}):\n"
                               + self.log.read_text()[-2000:])
            try:
                with urllib.request.urlopen(self.url + "/v1/ping", timeout=1):
                    return
            except OSError:
                time.sleep(0.2)
        raise RunError(f"the controller did not answer on {self.url}; see {self.log}")

    def stop(self) -> None:
        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(15)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(15)


def _squeue_states(env: dict[str, str], ids: list[int]) -> dict[int, str]:
    out = subprocess.run(["squeue", "-h", "-t", "all", "-j", ",".join(map(str, ids)),
                          "-o", "%i %T"], env=env, capture_output=True, text=True,
                         timeout=30, check=False)
    states: dict[int, str] = {}
    for line in out.stdout.splitlines():
        jid, _, st = line.partition(" ")
        if jid.isdigit():
            states[int(jid)] = st.strip()
    return states


def _read_steps(path: Path) -> tuple[list[float], float]:
    rewards: list[float] = []
    wall = float("nan")
    with contextlib.suppress(OSError):
        for line in path.read_text().splitlines():
            if not line.startswith("{"):
                continue
            with contextlib.suppress(ValueError):
                row = json.loads(line)
                if row.get("event") == "step":
                    rewards.append(float(row["reward"]))
                elif row.get("event") == "done":
                    wall = float(row["wall_s"])
    return rewards, wall


def prepare_dir(base: Path) -> Path:
    """A fresh run dir every job user can read (examples copied in) and write output to."""
    if base.exists():
        shutil.rmtree(base)
    base.mkdir(parents=True)
    shutil.copytree(HERE, base / "examples", ignore=shutil.ignore_patterns("__pycache__"))
    for p in [base, *base.rglob("*")]:
        p.chmod(0o755 if p.is_dir() else 0o644)
    out = base / "out"
    out.mkdir()
    out.chmod(0o1777)
    return base


def run(
    label: str, mux: str, run_dir: Path, state_dir: Path, *, steps: int | None = None,
    tick: Callable[[str, list[tuple[str, str, int]]], None] | None = None,
    tick_s: float = 5.0, timeout_s: float = 600.0,
    jobs: tuple[tuple[str, str], ...] = JOBS, floating: bool = False,
) -> RunResult:
    """Run `jobs` with `--rl-mux=<mux>` ("auto" multiplexes, "off" is dedicated);
    `floating`: the site lets pools float (`slurm.floating_pools`)."""
    prepare_dir(run_dir)
    env = slurm_env(state_dir)
    ctl = Controller(run_dir, env, floating)
    submitted: list[tuple[str, str, int]] = []
    t0 = time.time()
    try:
        ctl.start()
        for name, user in jobs:
            out = run_dir / "out" / f"{name}.out"
            argv = ["runuser", "-u", user, "--", "sbatch", "--parsable",
                    f"--output={out}", f"--rl-mux={mux}", f"jobs/{name}.sbatch",
                    "--controller", ctl.url]
            if steps is not None:
                argv += ["--steps", str(steps)]
            done = subprocess.run(argv, cwd=run_dir / "examples", env=env,
                                  capture_output=True, text=True, timeout=60, check=False)
            if done.returncode != 0:
                raise RunError(f"sbatch of {name} as {user} failed: {done.stderr.strip()}")
            submitted.append((name, user, int(done.stdout.strip().split(";")[0])))
        ids = [j for _, _, j in submitted]
        deadline = time.monotonic() + timeout_s
        next_tick = 0.0
        while True:
            states = _squeue_states(env, ids)
            if all(states.get(j, "GONE") in TERMINAL | {"GONE"} for j in ids):
                break
            if time.monotonic() >= deadline:
                raise RunError(f"{label}: jobs still running after {timeout_s:g} s: {states}")
            if tick is not None and time.monotonic() >= next_tick:
                tick(ctl.url, submitted)
                next_tick = time.monotonic() + tick_s
            time.sleep(1.0)
        makespan = time.time() - t0
        time.sleep(3.0)  # let the controller notice the ends and close the pools
    finally:
        ctl.stop()
        left = [str(j) for _, _, j in submitted]
        if left:
            subprocess.run(["scancel", *left], env=env, capture_output=True, timeout=30,
                           check=False)
        _cancel_pools(ctl.db, env)
    return _collect(label, mux, ctl.db, submitted, run_dir, env, makespan)


def _cancel_pools(db: Path, env: dict[str, str]) -> None:
    """Pools the controller did not close before it stopped (a failed run) end here."""
    if not db.exists():
        return
    from slurmrl.db import Store

    store = Store(str(db))
    try:
        ids = [str(p.slurm_job_id) for p in store.pools() if p.slurm_job_id is not None]
    finally:
        store.close()
    if ids:
        subprocess.run(["scancel", *ids], env=env, capture_output=True, timeout=30,
                       check=False)


def _collect(label: str, mux: str, db: Path, submitted: list[tuple[str, str, int]],
             run_dir: Path, env: dict[str, str], makespan: float) -> RunResult:
    from slurmrl.db import Store

    store = Store(str(db))
    try:
        states = _squeue_states(env, [j for _, _, j in submitted])
        recs = {j.job_id: j for j in store.jobs()}
        results = []
        for name, user, jid in submitted:
            out = run_dir / "out" / f"{name}.out"
            rewards, wall = _read_steps(out)
            rec = recs.get(jid)
            results.append(JobResult(name, user, jid, states.get(jid, "GONE"), rewards, wall,
                                     None if rec is None else rec.pool_id, out))
        now = time.time()
        pools = store.pools()
        pool_gpu_s = sum(store.pool_gpu_seconds(p, now) for p in pools)
        leased = sum(store.gpu_seconds([j for _, _, j in submitted]).values())
        return RunResult(label, mux, db, results, makespan, pool_gpu_s, leased, len(pools))
    finally:
        store.close()


def write_trace(result: RunResult, path: Path) -> int:
    """The run's ended phase leases as a `slurmrl simulate --replay` trace (what
    `slurmrl report --trace` writes); 0 and no file when the run ended none."""
    from slurmrl.report.sources import SourceError
    from slurmrl.report.trace import write_trace as export

    try:
        return export(result.db, path, [j.slurm_job_id for j in result.jobs])
    except SourceError:  # no DB, or no ended lease: no stale trace of an earlier run
        path.unlink(missing_ok=True)
        return 0
