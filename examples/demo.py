#!/opt/slurmrl/venv/bin/python
"""`make demo`: four real RLVR jobs of two users, dedicated and then multiplexed by slurmrl.

The Makefile has brought the local Slurm up (and takes it down afterwards). This script,
as root:

1. runs the four jobs of examples/jobs/ (two for rlalice, two for rlbob, different
   phase profiles) with `--rl-mux=off`: each job gets its own pool, the baseline;
2. runs the same four jobs multiplexed (`--rl-mux=auto`): the controller pairs them
   into shared pools and time-slices each pool's GPU between the pair with leases,
   showing `slurmrl status` while they run;
3. prints `slurmrl report` of the multiplexed run against the dedicated one, writes
   the timeline PNG, and checks the promise: fewer GPU-seconds multiplexed, and every
   job's reward rising in both runs. Exit 1 if not.

Each run starts its own controller (DB, config and job output under
$SLURMRL_DEV_STATE/demo/, each run's directory deleted first) and stops it at the end,
pass or fail. Set DEMO_STEPS to shorten the jobs (default: the driver's 60 steps).
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

# run as a script: examples/ is on sys.path
from e2e_run import SLURMRL, RunError, RunResult, run, slurm_env


def say(text: str = "") -> None:
    print(text, flush=True)


def show_status(url: str, submitted: list[tuple[str, str, int]]) -> None:
    say(f"--- slurmrl status --controller {url}   ({time.strftime('%H:%M:%S')})")
    env = {**os.environ, "SLURMRL_CONTROLLER": url}
    out = subprocess.run([SLURMRL, "status", "--controller", url, "-a"], env=env,
                         capture_output=True, text=True, timeout=30, check=False)
    say((out.stdout or out.stderr).rstrip())
    pools = subprocess.run([SLURMRL, "status", "--controller", url, "--pools"], env=env,
                           capture_output=True, text=True, timeout=30, check=False)
    say((pools.stdout or pools.stderr).rstrip())


def summary(res: RunResult) -> None:
    say(f"\n{res.label}: {len(res.jobs)} jobs in {res.pools} pool(s), makespan "
        f"{res.makespan_s:.0f} s, pool GPU-seconds {res.pool_gpu_s:.0f}, leased "
        f"GPU-seconds {res.leased_gpu_s:.0f}")
    for j in res.jobs:
        say(f"  {j.name:14s} {j.user:8s} job {j.slurm_job_id:<5d} {j.state:10s} pool "
            f"{j.pool_id}  wall {j.wall_s:5.0f} s  reward {j.reward_first:.2f} -> "
            f"{j.reward_last:.2f} ({len(j.rewards)} steps)")


def _exit_on(signum: int, frame: object) -> None:
    raise SystemExit(128 + signum)


def parse_args(argv: Sequence[str] | None = None) -> int | None:
    """The command line (it takes no argument but --help) and DEMO_STEPS: the steps of
    each job (None: the driver's own). A usage error exits 2 before anything is run."""
    parser = argparse.ArgumentParser(
        prog="demo.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="environment:\n"
        "  SLURMRL_DEV_STATE  the dev cluster's state directory (default /var/lib/slurmrl-dev)\n"
        "  DEMO_STEPS         steps of each job (default: the driver's 60)\n"
        "  SLURMRL_VENV       the slurmrl install (default /opt/slurmrl/venv)")
    parser.parse_args(argv)
    steps = os.environ.get("DEMO_STEPS")
    if not steps:
        return None
    if not (steps.isascii() and steps.isdigit() and int(steps) >= 2):
        # the verdict compares a job's first and last windows of steps: one has neither
        parser.error(f"DEMO_STEPS must be a number of steps of at least 2 (the verdict "
                     f"compares each job's first and last rewards), got {steps[:40]!r}")
    return int(steps)


def main(argv: Sequence[str] | None = None) -> int:
    steps = parse_args(argv)
    # make's recipe runs this in the background and passes Ctrl-C or SIGTERM on as a
    # SIGTERM (a background job ignores SIGINT): both must unwind through `run`'s
    # `finally`, which stops the controller and cancels the jobs and pools
    signal.signal(signal.SIGTERM, _exit_on)
    signal.signal(signal.SIGINT, signal.default_int_handler)
    if os.geteuid() != 0:
        say("demo: run as root (make demo): it starts a controller and submits as two users")
        return 2
    state = Path(os.environ.get("SLURMRL_DEV_STATE", "/var/lib/slurmrl-dev"))
    base = state / "demo"
    say("slurmrl demo: 4 GRPO jobs (2 users) on the local Slurm: 4 fake GPUs, `tiny` "
        "model on CPU.\nJobs: examples/jobs/{math,agentic}.sbatch (rlalice/rlbob), "
        "{math-big,agentic-small}.sbatch; each asks `#SBATCH --rl-gpus=1`.\n")
    try:
        say("== 1/2 dedicated baseline: the same jobs with --rl-mux=off (one pool each)")
        dedicated = run("dedicated", "off", base / "dedicated", state, steps=steps,
                        tick=show_status, tick_s=20.0)
        summary(dedicated)
        say("\n== 2/2 multiplexed: --rl-mux=auto (the controller pairs jobs into pools)")
        mux = run("multiplexed", "auto", base / "multiplexed", state, steps=steps,
                  tick=show_status, tick_s=10.0)
        summary(mux)
    except RunError as exc:
        say(f"\ndemo FAILED: {exc}")
        return 1
    plot = base / "timeline.png"
    say(f"\n== slurmrl report --db {mux.db} --baseline {dedicated.db} --plot {plot}")
    rep = subprocess.run([SLURMRL, "report", "--db", str(mux.db), "--baseline",
                          str(dedicated.db), "--plot", str(plot)], env=slurm_env(state),
                         capture_output=True, text=True, timeout=120, check=False)
    say((rep.stdout + rep.stderr).rstrip())
    return verdict(dedicated, mux)


def verdict(dedicated: RunResult, mux: RunResult) -> int:
    problems = []
    for res in (dedicated, mux):
        for j in res.jobs:
            if j.state != "COMPLETED":
                problems.append(f"{res.label} {j.name}: Slurm state {j.state} (see {j.output})")
            elif not j.reward_last > j.reward_first + 0.1:
                problems.append(f"{res.label} {j.name}: reward did not rise "
                                f"({j.reward_first:.2f} -> {j.reward_last:.2f})")
    saved = 1 - mux.pool_gpu_s / dedicated.pool_gpu_s if dedicated.pool_gpu_s else 0.0
    if mux.pool_gpu_s >= dedicated.pool_gpu_s:
        problems.append(f"multiplexed used {mux.pool_gpu_s:.0f} GPU-s, not fewer than "
                        f"dedicated {dedicated.pool_gpu_s:.0f}")
    say(f"\nGPU-seconds (pool allocations): dedicated {dedicated.pool_gpu_s:.0f}, "
        f"multiplexed {mux.pool_gpu_s:.0f} ({100 * saved:.0f}% saved); makespan "
        f"{dedicated.makespan_s:.0f} s vs {mux.makespan_s:.0f} s")
    for d, m in zip(dedicated.jobs, mux.jobs, strict=True):
        slow = m.wall_s / d.wall_s if d.wall_s == d.wall_s and d.wall_s > 0 else float("nan")
        say(f"  {d.name:14s} slowdown {slow:.2f}x  reward {m.reward_first:.2f} -> "
            f"{m.reward_last:.2f} multiplexed")
    if problems:
        say("\ndemo FAILED:\n  " + "\n  ".join(problems))
        return 1
    say("\ndemo OK: the multiplexed run used fewer GPU-seconds, and every job learned.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
