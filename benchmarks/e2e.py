#!/opt/slurmrl/venv/bin/python
"""End-to-end benchmark: the four reference RLVR jobs, dedicated vs multiplexed, on real Slurm.

Runs examples/jobs/ once with `--rl-mux=off` (each job its own pool) and once with
`--rl-mux=auto` (the controller pairs them), each under a fresh controller on the dev
cluster, and prints side by side: pool GPU-seconds (GPUs x pool lifetime, what Slurm
allocated), leased GPU-seconds (the controller's ledger), makespan, per-job wall time and
slowdown, and each job's reward (first 10 steps -> last 10). Then it writes the
multiplexed run's phase observations as a trace (`slurmrl-trace/1` JSONL) and replays
it with `slurmrl simulate --replay`, comparing the predicted makespan with the measured
one (the simulator's fidelity target: within 15%). Before that, it previews the
multiplexed run from the dedicated one alone, as a site would before turning slurmrl
on: the dedicated run's trace through `slurmrl simulate -w` (the default policy placing
those jobs anew), predicted savings and slowdowns beside the measured ones.

    SLURMRL_DEV_STATE=/var/lib/slurmrl-dev benchmarks/e2e.py [--steps N] [--out DIR]

Needs root and the dev cluster up. Caveats, printed with the numbers: on this machine
"GPUs" are fake and the tiny model's GPU phases run on the same 2 CPU cores as
everything else, so four dedicated jobs contend for CPU more than two pairs do.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
from pathlib import Path

# this directory's policies.py would shadow the `policies` package the trace export imports
sys.path[:] = [p for p in sys.path if Path(p or ".").resolve() != Path(__file__).parent.resolve()]
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from e2e_run import SLURMRL, RunResult, run, write_trace  # noqa: E402


def table(ded: RunResult, mux: RunResult) -> str:
    lines = [f"{'':24s} {'dedicated':>12s} {'multiplexed':>12s}",
             f"{'pools':24s} {ded.pools:12d} {mux.pools:12d}",
             f"{'pool GPU-seconds':24s} {ded.pool_gpu_s:12.0f} {mux.pool_gpu_s:12.0f}",
             f"{'leased GPU-seconds':24s} {ded.leased_gpu_s:12.1f} {mux.leased_gpu_s:12.1f}",
             f"{'makespan (s)':24s} {ded.makespan_s:12.0f} {mux.makespan_s:12.0f}",
             "", f"{'job':14s} {'user':8s} {'wall ded':>9s} {'wall mux':>9s} {'slowdown':>9s}"
             f"  reward ded            reward mux"]
    for d, m in zip(ded.jobs, mux.jobs, strict=True):
        slow = m.wall_s / d.wall_s if d.wall_s > 0 else float("nan")
        lines.append(f"{d.name:14s} {d.user:8s} {d.wall_s:9.0f} {m.wall_s:9.0f} {slow:9.2f}"
                     f"  {d.reward_first:.2f} -> {d.reward_last:.2f}  "
                     f"        {m.reward_first:.2f} -> {m.reward_last:.2f}")
    saved = 1 - mux.pool_gpu_s / ded.pool_gpu_s if ded.pool_gpu_s else float("nan")
    lines.append(f"\nGPU-seconds saved by multiplexing: {100 * saved:.1f}%")
    return "\n".join(lines)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=None, help="GRPO steps per job")
    ap.add_argument("--out", type=Path, default=None, help="where runs, trace and JSON go")
    ap.add_argument("--floating", action="store_true",
                    help="also run the jobs multiplexed where pools may float "
                         "(slurm.floating_pools, up to 4 jobs a pool)")
    args = ap.parse_args()
    if args.steps is not None and args.steps < 2:  # before any result is wiped
        ap.error(f"--steps must be at least 2 (each job's first and last rewards are "
                 f"compared), got {args.steps}")
    state = Path(os.environ.get("SLURMRL_DEV_STATE", "/var/lib/slurmrl-dev"))
    out = args.out or state / "bench-e2e"
    out.mkdir(parents=True, exist_ok=True)
    print(f"machine: {os.cpu_count()} CPU cores, {platform.machine()}, no GPU (4 fake "
          "GPUs via GRES), tiny backend on CPU", flush=True)
    ded = run("dedicated", "off", out / "dedicated", state, steps=args.steps)
    mux = run("multiplexed", "auto", out / "multiplexed", state, steps=args.steps)
    print(table(ded, mux), flush=True)
    flo = None
    if args.floating:
        flo = run("floating", "auto", out / "floating", state, steps=args.steps,
                  floating=True)
        print("\nwhere pools may float (slurm.floating_pools, up to 4 jobs a pool):")
        print(table(ded, flo), flush=True)
    preview = _preview(ded, mux, out / "dedicated-trace.jsonl")
    trace = out / "multiplexed-trace.jsonl"
    n = write_trace(mux, trace)
    sim = subprocess.run([SLURMRL, "simulate", "--replay", str(trace), "--json"],
                         capture_output=True, text=True, timeout=300, check=False)
    replay: dict[str, float] = {}
    if sim.returncode == 0:
        replay = json.loads(sim.stdout)["replay"]
        measured = replay["recorded_makespan_s"]
        print(f"\nreplay of {n} phase observations ({trace}):\n"
              f"  measured multiplexed makespan (first request -> last release) "
              f"{measured:.1f} s\n  simulator's prediction {replay['predicted_makespan_s']:.1f}"
              f" s: error {100 * replay['error']:+.1f}% (target: within 15%)")
    else:
        print(f"\nslurmrl simulate --replay failed: {sim.stderr.strip()}")
    summary = {"dedicated": _res(ded), "multiplexed": _res(mux), "replay": replay,
               "preview": preview, **({"floating": _res(flo)} if flo is not None else {})}
    failed = [f"{r.label} {j.name}: Slurm state {j.state}"
              for r in (ded, mux, *([flo] if flo is not None else [])) for j in r.jobs
              if j.state != "COMPLETED"]
    summary["failed"] = failed
    (out / "e2e.json").write_text(json.dumps(summary, indent=2))
    print(f"\nwrote {out / 'e2e.json'}")
    if failed:  # a job that ended early ends its pool early: the saving would be false
        print("\nnot a measurement: " + "; ".join(failed), file=sys.stderr)
        return 1
    return 0


def _preview(ded: RunResult, mux: RunResult, trace: Path) -> dict[str, float]:
    """What `slurmrl simulate -w` predicts from the dedicated run alone (the default
    policy placing its jobs anew), beside what the multiplexed run measured."""
    if write_trace(ded, trace) == 0:
        print("\nno dedicated trace to preview from")
        return {}
    # the harness forced --rl-mux=off for the dedicated run; the scripts ask for auto
    lines = trace.read_text().splitlines()
    header = json.loads(lines[0])
    for spec in header["jobs"]:
        spec.pop("mux", None)
    trace.write_text("\n".join([json.dumps(header), *lines[1:]]) + "\n")
    sim = subprocess.run([SLURMRL, "simulate", "-w", str(trace), "--json"],
                         capture_output=True, text=True, timeout=300, check=False)
    if sim.returncode != 0:
        print(f"\nslurmrl simulate -w failed: {sim.stderr.strip()}")
        return {}
    m = json.loads(sim.stdout)["metrics"]
    saved = 1 - mux.pool_gpu_s / ded.pool_gpu_s if ded.pool_gpu_s else float("nan")
    slow = max((x.wall_s / d.wall_s for d, x in zip(ded.jobs, mux.jobs, strict=True)
                if d.wall_s > 0), default=float("nan"))
    print(f"\npreview from the dedicated run (`slurmrl simulate -w {trace.name}`, the "
          f"default policy placing its {m['jobs']} jobs anew):\n"
          f"  predicted: {100 * m['savings']:.1f}% GPU-seconds saved, {m['shared_pools']} "
          f"shared pools, worst slowdown {m['slowdown_max']:.2f}\n"
          f"  measured by the multiplexed run: {100 * saved:.1f}% pool GPU-seconds saved, "
          f"worst slowdown {slow:.2f}")
    return {"predicted_savings": m["savings"], "predicted_slowdown_max": m["slowdown_max"],
            "predicted_shared_pools": m["shared_pools"], "measured_savings": saved,
            "measured_slowdown_max": slow}


def _res(r: RunResult) -> dict[str, object]:
    return {"pools": r.pools, "pool_gpu_s": r.pool_gpu_s, "leased_gpu_s": r.leased_gpu_s,
            "makespan_s": r.makespan_s, "db": str(r.db),
            "jobs": [{"name": j.name, "user": j.user, "state": j.state, "wall_s": j.wall_s,
                      "pool": j.pool_id, "reward_first10": j.reward_first,
                      "reward_last10": j.reward_last, "steps": len(j.rewards)}
                     for j in r.jobs]}


if __name__ == "__main__":
    sys.exit(main())
