#!/opt/slurmrl/venv/bin/python
"""Floating pools on real processes: do packed rollout tails free GPU-seconds?

Three RL jobs of 2 GPUs (tiny model, rollouts as one-GPU replicas decoding in rounds)
run the same steps three ways on the dev cluster, each under a fresh controller:

- `dedicated`: `--rl-mux=off`, each job its own pool of 2 GPUs;
- `held`: one floating pool of two windows (4 GPUs) for the three, a rollout keeping its
  whole window through its tail (`give_back=False`);
- `packed`: the same pool, a tail that needs one replica packing beside another job's
  tail (`Lease.pack`), so that a whole window frees for a waiting phase.

Placement is forced by a small site policy (the three jobs into one floating pool, as in
tests/integration/test_floating.py): this measures the mechanism, not the default
policy's choices. `--only policy` runs a fourth way (not run by default): pools may
float and tails pack, and the site's default pairing policy places the three. It prints
pool GPU-seconds (what Slurm allocated: each window's GPUs times its life), makespan and
each job's wall time and slowdown against dedicated.

    SLURMRL_DEV_STATE=/var/lib/slurmrl-dev benchmarks/floating_pack.py [--steps N]
        [--across-nodes]

Caveats, printed with the numbers: the "GPUs" are fake and the tiny model decodes on
the 2 CPU cores in milliseconds, so each round's decode time is modelled by a sleep
with the lease held (`--round-s`), as are the reward check (`--reward-s`, no lease) and
the rest of a train step (`--train-s`); the tail's shape (how many sequences each
round leaves unfinished) is the tiny model's own. Needs root and the dev cluster up.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples"))

from e2e_run import PYTHON, Controller, slurm_env

POLICY = '''
from policies.base import Action, Placement, PoolMode


class FloatTwo:
    """One floating pool of up to two windows: the first job opens it, the second adds
    a window, the third joins the two."""

    name = "float-bench"
    mode = PoolMode.LEASE

    def place(self, snapshot):
        out, pool = [], next((p for p in snapshot.pools if p.floating), None)
        size, pid = (pool.gpus, pool.pool_id) if pool is not None else (0, None)
        for job in snapshot.waiting:
            g = job.request.gpus
            if pid is None:
                pid = -1
                out.append(Placement(job.job_id, Action.OPEN, pid, g, floating=True))
                continue
            size = min(size + g, 2 * g)
            out.append(Placement(job.job_id, Action.JOIN if pid > 0 else Action.OPEN, pid,
                                 size, floating=True))
        return out
'''

DRIVER = '''#!{python}
"""One RL job: rollout in rounds (a modelled decode time per round), reward check,
train, sync; a JSON line per step and one when done."""
import json, sys, time, slurmrl
url, steps, pack = sys.argv[1], int(sys.argv[2]), sys.argv[3] == "pack"
round_s, train_s, reward_s = map(float, sys.argv[4:7])
job = slurmrl.connect(url=url)
ro, tr = job.service("rollout", timeout_s=1800), job.service("trainer", timeout_s=1800)
prompts = [f"{{k}}+{{k}}=" for k in range(48)]
t0 = time.time()
for step in range(steps):
    gpu_rounds = []
    with job.phase("rollout") as lease:
        def tail(left):  # after each round, with the lease held: the round's decode time
            time.sleep(round_s)
            gpu_rounds.append(len(lease.gpus))
        out = ro.generate(prompts, max_tokens=16, seed=step, round_tokens=4,
                          on_tail=tail, give_back=pack)
    time.sleep(reward_s)  # reward checks on CPU, no lease held
    with job.phase("train"):
        tr.train_step([{{"prompt_ids": list(s.prompt_ids),
                        "completion_ids": list(s.completion_ids),
                        "advantage": 1.0 if k % 2 else -1.0}}
                       for k, s in enumerate(out.samples[:8])])
        time.sleep(train_s)
    with job.phase("sync"):
        tr.sync_weights_to(ro)
    print(json.dumps({{"event": "step", "step": step, "rounds_gpus": gpu_rounds}}),
          flush=True)
print(json.dumps({{"event": "done", "wall_s": time.time() - t0}}), flush=True)
'''

USERS = ("rlalice", "rlbob", "rlalice")
TERMINAL = {"COMPLETED", "FAILED", "CANCELLED", "TIMEOUT", "NODE_FAIL", "GONE"}


@dataclass
class Result:
    label: str
    pool_gpu_s: float
    leased_gpu_s: float
    makespan_s: float
    walls: list[float]
    pools: int
    states: list[str]


#: with --across-nodes: each spread node's hand-off directory (`%n`), made as an admin
#: would make /dev/shm's: sticky, writable by the users
ACROSS_ROOT = "/dev/shm/slurmrl-bench-%n"
SPREAD_NODES = ("n2", "n3")


def _config(ctl: Controller, floating: bool, forced: bool, across: bool) -> None:
    """The run's site config: one-GPU rollout replicas; pools may float, and with
    `forced` the three go to one floating pool (else the default policy places them);
    with `across`, pools go to partition `spread` (two Slurm nodes of 2 GPUs), a
    floating pool's second window to the other node, each job's state fetched there."""
    text = ctl.config.read_text()
    if floating:
        text = text.replace("max_jobs_per_pool = 4", "max_jobs_per_pool = 3")
    if across:
        text = text.replace('pool_partition = "pools"', 'pool_partition = "spread"')
        text = text.replace("floating_pools = true",
                            "floating_pools = true\nfloating_across_nodes = true")
    if forced:
        text += '\n[policies]\npairing = "floatbench:FloatTwo"\n'
    text += "\n[services]\nrollout_replica_gpus = 1\n"
    if across:
        text += f'handoff_dir = "{ACROSS_ROOT}"\n'
    ctl.config.write_text(text)


def _states(env: dict[str, str], ids: list[int]) -> dict[int, str]:
    out = subprocess.run(["squeue", "-h", "-t", "all", "-j", ",".join(map(str, ids)),
                          "-o", "%i %T"], env=env, capture_output=True, text=True,
                         timeout=30, check=False).stdout
    got = dict(line.split() for line in out.splitlines() if len(line.split()) == 2)
    return {j: got.get(str(j), "GONE") for j in ids}


def run(label: str, base: Path, state: Path, args: argparse.Namespace) -> Result:
    from slurmrl.db import Store

    run_dir = base / label
    subprocess.run(["rm", "-rf", str(run_dir)], check=True)
    run_dir.mkdir(parents=True)
    run_dir.chmod(0o755)
    out_dir = run_dir / "out"
    out_dir.mkdir()
    out_dir.chmod(0o1777)
    (run_dir / "floatbench.py").write_text(POLICY)
    driver = run_dir / "driver.py"
    driver.write_text(DRIVER.format(python=PYTHON))
    driver.chmod(0o755)
    env = slurm_env(state)
    floating = label != "dedicated"
    ctl = Controller(run_dir, {**env, "PYTHONPATH": str(run_dir)}, floating)
    forced = label in ("held", "packed")
    _config(ctl, floating, forced, args.across_nodes)
    if args.across_nodes:
        for node in SPREAD_NODES:
            root = Path(ACROSS_ROOT.replace("%n", node))
            subprocess.run(["rm", "-rf", str(root)], check=True)
            root.mkdir()
            root.chmod(0o1777)
    ids: list[int] = []
    t0 = time.time()
    try:
        ctl.start()
        store = Store(str(ctl.db))
        for k, user in enumerate(USERS):
            mode = "hold" if label in ("dedicated", "held") else "pack"
            wrap = (f"{driver} {ctl.url} {args.steps} {mode}"
                    f" {args.round_s} {args.train_s} {args.reward_s}")
            sub = subprocess.run(
                ["runuser", "-u", user, "--", "sbatch", "--parsable", "--partition=drivers",
                 "--rl-gpus=2", "--rl-model=tiny", "--rl-max-slowdown=3", "--time=30",
                 f"--rl-mux={'off' if label == 'dedicated' else 'auto'}",
                 f"--output={out_dir / f'job{k}.out'}", f"--wrap={wrap}"],
                cwd=run_dir, env=env, capture_output=True, text=True, timeout=60, check=True)
            ids.append(int(sub.stdout.strip().split(";")[0]))
            # one at a time into the floating pool (dedicated: the 4 GPUs hold two
            # jobs' pools, and the third waits in Slurm for one to end; `policy`: the
            # default policy may keep one waiting too)
            deadline = time.monotonic() + 120
            while forced and ((j := store.job(ids[-1])) is None or j.pool_id is None):
                if time.monotonic() > deadline:
                    raise RuntimeError(f"{label}: job {ids[-1]} not placed; see {ctl.log}")
                time.sleep(0.5)
        deadline = time.monotonic() + args.timeout_s
        while not all(s in TERMINAL for s in _states(env, ids).values()):
            if time.monotonic() > deadline:
                raise RuntimeError(f"{label}: jobs still running after {args.timeout_s} s")
            time.sleep(1.0)
        makespan = time.time() - t0
        time.sleep(3.0)  # the controller sees the ends and closes the pool
        states = list(_states(env, ids).values())
    finally:  # nothing of the run may hold the dev cluster's GPUs after it
        ctl.stop()
        if args.across_nodes:
            for node in SPREAD_NODES:
                subprocess.run(["rm", "-rf", ACROSS_ROOT.replace("%n", node)], check=False)
        if ids:
            subprocess.run(["scancel", *map(str, ids)], env=env, capture_output=True,
                           timeout=30, check=False)
        if ctl.db.exists():
            store = Store(str(ctl.db))
            for p in store.pools():
                left = {w.slurm_job_id for w in store.windows(p.pool_id, open_only=False)}
                subprocess.run(["scancel", *map(str, {*left, p.slurm_job_id} - {None})],
                               env=env, capture_output=True, timeout=30, check=False)
    store = Store(str(ctl.db))
    now = time.time()
    walls = []
    for k in range(len(USERS)):
        done = [json.loads(x) for x in (out_dir / f"job{k}.out").read_text().splitlines()
                if x.startswith('{"event": "done"')]
        walls.append(float(done[0]["wall_s"]) if done else float("nan"))
    return Result(label, sum(store.pool_gpu_seconds(p, now) for p in store.pools()),
                  sum(store.gpu_seconds(ids).values()), makespan, walls, len(store.pools()),
                  states)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--steps", type=int, default=40, help="RL steps per job")
    ap.add_argument("--round-s", type=float, default=0.5,
                    help="modelled decode time of one rollout round (4 tokens)")
    ap.add_argument("--train-s", type=float, default=0.5, help="modelled train time")
    ap.add_argument("--reward-s", type=float, default=1.0, help="modelled reward check")
    ap.add_argument("--timeout-s", type=float, default=900.0)
    ap.add_argument("--only", choices=("dedicated", "held", "packed", "policy"),
                    action="append", help="run only these (repeatable); `policy`: pools may "
                    "float and tails pack, the default policy placing the three")
    ap.add_argument("--out", type=Path, default=None)
    ap.add_argument("--across-nodes", action="store_true",
                    help="pools on partition spread (two Slurm nodes of 2 GPUs, both this "
                    "machine): a floating pool's windows on both, states fetched across")
    args = ap.parse_args()
    state = Path(os.environ.get("SLURMRL_DEV_STATE", "/var/lib/slurmrl-dev"))
    base = args.out or state / ("bench-floating-pack" + ("-across" if args.across_nodes
                                                         else ""))
    where = ("partition spread: nodes n2, n3 of 2 fake GPUs each, windows across them"
             if args.across_nodes else "partition pools: one node of 4 fake GPUs")
    print(f"{where}; machine: {os.cpu_count()} CPU cores, no GPU (fake GPUs via GRES), tiny "
          f"backend on CPU; 3 jobs x {args.steps} steps of 2 GPUs; modelled times: "
          f"{args.round_s} s a rollout round (4 rounds), {args.train_s} s train, "
          f"{args.reward_s} s reward", flush=True)
    results = [run(label, base, state, args)
               for label in args.only or ("dedicated", "held", "packed")]
    ded = next((r for r in results if r.label == "dedicated"), None)
    print(f"\n{'':10s} {'pools':>5s} {'pool GPU-s':>10s} {'leased GPU-s':>12s} "
          f"{'makespan':>8s} {'saved':>6s}  job wall s (slowdown)")
    for r in results:
        saved = (f"{100 * (1 - r.pool_gpu_s / ded.pool_gpu_s):5.1f}%"
                 if ded is not None and ded.pool_gpu_s else "   n/a")
        walls = "  ".join(
            f"{w:5.1f}" + (f" ({w / d:4.2f})" if ded is not None else "")
            for w, d in zip(r.walls, ded.walls if ded is not None else r.walls, strict=True))
        print(f"{r.label:10s} {r.pools:5d} {r.pool_gpu_s:10.0f} {r.leased_gpu_s:12.0f} "
              f"{r.makespan_s:8.0f} {saved:>6s}  {walls}   {sorted(set(r.states))}")
    (base / "results.json").write_text(json.dumps([asdict(r) for r in results], indent=1))
    print(f"\nresults: {base / 'results.json'}")
    return 0 if all(s == "COMPLETED" for r in results for s in r.states) else 1


if __name__ == "__main__":
    sys.exit(main())
