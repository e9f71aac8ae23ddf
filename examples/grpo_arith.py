#!/opt/slurmrl/venv/bin/python
"""The reference RLVR driver: GRPO on "a+b=" with exact-match reward, through slurmrl.

Submit it as a Slurm batch job with `#SBATCH --rl-*` directives (see
examples/jobs/*.sbatch); it runs on a CPU node of the drivers partition and does

    job = slurmrl.connect()                          # registers; the controller places it
    rollout, trainer = job.service("rollout"), job.service("trainer")
    each step: rollout lease -> generate;  reward gap on this CPU (+ tool latency);
               train lease -> train_step;  sync lease -> trainer weights to rollout
               (the train lease switches to the sync where the controller allows: `Lease.switch`)

The algorithm is in examples/rlvr.py. Each step prints one JSON line
(`{"step", "reward", "loss", "rollout_s", ...}`) and reports the reward gap to the
controller with its mean reward, which `slurmrl report` draws as the reward curve.

Backends: the services are whatever the site runs for the job's `--rl-model`: the
`tiny` CPU model on the dev cluster; on a GPU cluster a site with
`services.rollout_backend = "vllm"` and `services.trainer_backend = "torch"` runs the
same driver unchanged with e.g. `--rl-model=Qwen/Qwen2.5-0.5B-Instruct` (then pass
`--max-tokens 16` or so: a real model writes more than one token). That GPU path has
NOT been run in this project (no GPU here); see docs/user-guide.md.

Known limits: one trainer service; blocking calls; no checkpointing.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any

# run as a script, so its own directory (examples/) is on sys.path
from rlvr import GrpoConfig, StepLog, train


def _limit_threads() -> None:
    # 2 cores shared by several drivers and services on the dev cluster: one thread each
    os.environ.setdefault("OMP_NUM_THREADS", "1")


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    d = GrpoConfig()
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--steps", type=int, default=d.steps)
    p.add_argument("--prompts-per-step", type=int, default=d.prompts_per_step)
    p.add_argument("--group-size", type=int, default=d.group_size)
    p.add_argument("--max-operand", type=int, default=d.max_operand)
    p.add_argument("--max-tokens", type=int, default=d.max_tokens)
    p.add_argument("--temperature", type=float, default=d.temperature)
    p.add_argument("--tool-latency", type=float, default=d.tool_latency_s,
                   help="seconds of simulated tool waiting per step, in the reward gap "
                   "(models an agentic job; a sleep, not real tool use)")
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--controller", default=None,
                   help="controller URL (default: $SLURMRL_CONTROLLER, which the SPANK "
                   "plugin sets from plugstack.conf)")
    p.add_argument("--rollout-min-gpus", type=int, default=None,
                   help="start a rollout on this many free GPUs of its set rather than wait "
                        "for all (with the site's rollout replicas: the replicas there)")
    p.add_argument("--round-tokens", type=int, default=None,
                   help="decode the rollout in rounds of this many tokens, moving the "
                        "unfinished sequences onto the fewest replicas between rounds and "
                        "giving the rest back (needs the site's rollout replicas)")
    p.add_argument("--metrics", type=Path, default=None,
                   help="also append each step's JSON line to this file")
    return p.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    _limit_threads()
    args = parse_args(argv)
    try:
        cfg = GrpoConfig(steps=args.steps, prompts_per_step=args.prompts_per_step,
                         group_size=args.group_size, max_operand=args.max_operand,
                         max_tokens=args.max_tokens, temperature=args.temperature,
                         tool_latency_s=args.tool_latency, round_tokens=args.round_tokens,
                         seed=args.seed)
    except ValueError as exc:
        print(f"grpo_arith: {exc}", file=sys.stderr)
        return 2
    import slurmrl
    from slurmrl.client.replicas import ReplicatedRollout

    t0 = time.time()
    try:
        job = slurmrl.connect(url=args.controller)
    except (ValueError, RuntimeError) as exc:  # a bad --controller; not in a Slurm job
        print(f"grpo_arith: {exc}", file=sys.stderr)
        return 2
    with job:
        print(json.dumps({"event": "registered", "job_id": job.job_id,
                          "config": cfg.__dict__}), flush=True)
        rollout = job.service("rollout", timeout_s=300)
        trainer = job.service("trainer", timeout_s=300)
        if cfg.round_tokens is not None and not isinstance(rollout, ReplicatedRollout):
            raise SystemExit("grpo_arith: --round-tokens needs the rollout run as replicas, "
                             "and this job's rollout is one engine (the site sets "
                             "[services] rollout_replica_gpus in slurmrl.toml)")

        def observe(phase: str, start: float, end: float, detail: dict[str, float]) -> None:
            # the reward gap with the step's mean reward: `slurmrl report` draws the curve
            job.observe(phase, start, end, detail=detail)

        def on_step(log: StepLog) -> None:
            line = json.dumps({"event": "step", "job_id": job.job_id, **log.as_dict()})
            print(line, flush=True)
            if args.metrics is not None:
                with args.metrics.open("a") as f:
                    f.write(line + "\n")

        def phase(name: str) -> AbstractContextManager[Any]:
            return job.phase(name, min_gpus=args.rollout_min_gpus if name == "rollout"
                             else None)

        # the sync runs on the train lease's GPUs: the train switches to it where the
        # controller allows (else the client releases and queues, Lease.switch)
        hist = train(cfg, rollout, trainer, phase, observe=observe, on_step=on_step,
                     switch_sync=True)
        print(json.dumps({"event": "done", "job_id": job.job_id, "wall_s": time.time() - t0,
                          "reward_first5": hist.window_mean(True),
                          "reward_last5": hist.window_mean(False)}), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
