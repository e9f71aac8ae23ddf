"""How far the pairing's predictor is from the simulator, by group size.

    PYTHONPATH=. python benchmarks/predictor_error.py [-w long-cot] [--groups 30]
        [--members 2 --members 3] [--what-if no-noise|no-tail|one-step-tail]

Draws groups of jobs of one workload (seed 0's 60 jobs, steady arrivals; members of one
GPU count and rollout split, shareable), starts each group in one pool at one instant
(`benchmarks/policies.py`'s `_alone`, round-robin slicing), runs it until its first
member is done, and compares each member's slowdown by then (wall time over the solo
time of the work it did) with the default policy's prediction (`complementarity.predict`)
on the members' profiles as observed by then: predicted minus measured, by the
predicted slowdown's range. Negative: the group ran slower than predicted.

What-ifs, to find where an error comes from: `no-noise` drops every job's per-step noise
and drift; `no-tail` also its rollout tail (the rollout holds its set to the end);
`one-step-tail` keeps noise and drift off and gives the simulated rollout a tail of one
step (its whole set, then one GPU, at the same mean share of the set: how the predictor
pictured every tail before commit b4096f2; it now pictures the halves it learns).
Prints a Markdown table; writes nothing (docs/benchmarks.md quotes it).
"""

from __future__ import annotations

import argparse
import itertools
import json
import random
import statistics
import sys
import tempfile
from dataclasses import replace
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from benchmarks.policies import _alone  # noqa: E402
from policies.complementarity import predict  # noqa: E402
from slurmrl.sim.runner import config_for  # noqa: E402
from slurmrl.sim.workload import WORKLOAD_DIR, SimJob, Workload, generate, load  # noqa: E402

WHAT_IFS = ("none", "no-noise", "no-tail", "one-step-tail")
RANGES = ((1.0, 1.3), (1.3, 1.6), (1.6, 1.9), (1.9, float("inf")))


def workload(name: str, what_if: str) -> Workload:
    """The suite's workload, or a copy without noise and drift (and tails for
    `no-tail`)."""
    if what_if == "none":
        return load(name)
    doc = json.loads((WORKLOAD_DIR / f"{name}.json").read_text())
    for c in doc["classes"]:
        c["drift"], c["noise_cv"] = 0.0, 0.0
        if what_if == "no-tail":
            c["tail"] = "none"
    with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
        json.dump(doc, f)
    try:
        return load(f.name)
    finally:
        Path(f.name).unlink()


def one_step(job: SimJob) -> SimJob:
    """The job with a tail of one step: its whole rollout set for a share x of the
    rollout, then one GPU, holding the same mean share of the set."""
    g = job.rollout_gpus
    if not job.tail or g <= 1:
        return job
    points = [(0.0, g), *job.tail, (1.0, 0)]
    share = sum((b[0] - a[0]) * a[1] / g for a, b in itertools.pairwise(points))
    x = max(0.0, (share - 1 / g) / (1 - 1 / g))
    return replace(job, tail=((x, 1),))


def errors(name: str, members: int, groups: int, what_if: str,
           seed: int = 0) -> list[tuple[float, float]]:
    """(predicted, predicted - measured) per member of each group drawn."""
    w = workload(name, what_if)
    cfg = config_for(w, check_invariants=False)
    by_kind: dict[tuple[int, int], list[SimJob]] = {}
    for j in generate(w, seed, "steady", 60):
        if not j.mux_off:
            by_kind.setdefault((j.gpus, j.rollout_gpus), []).append(j)
    kinds = [k for k, v in by_kind.items() if len(v) >= members]
    if not kinds:
        raise SystemExit(f"{name}: no {members} jobs of one GPU count to group")
    rng = random.Random(seed)
    out: list[tuple[float, float]] = []
    for _ in range(groups):
        drawn = rng.sample(by_kind[rng.choice(kinds)], members)
        group = [replace(j, job_id=i + 1, submit_s=0.0) for i, j in enumerate(drawn)]
        if what_if == "one-step-tail":
            group = [one_step(j) for j in group]
        sim = _alone(group, cfg, 0, until=lambda s: any(
            r.finished_at is not None for r in s.runs.values()))
        runs = sorted(sim.runs.values(), key=lambda r: r.job.job_id)
        measured = [sim.now / max(sim.work_done(r), 1e-9) for r in runs]
        predicted = predict([sim._snapshot(r) for r in runs]).slowdowns
        out += [(p, p - m) for p, m in zip(predicted, measured, strict=True)]
    return out


def table(rows: list[tuple[str, int, str, list[tuple[float, float]]]]) -> str:
    lines = ["| workload | members | what-if | predicted | members measured | "
             "predicted - measured, mean | sd | min |",
             "| --- | ---: | --- | --- | ---: | ---: | ---: | ---: |"]
    for name, members, what_if, errs in rows:
        for lo, hi in RANGES:
            e = [d for p, d in errs if lo <= p < hi]
            if len(e) < 2:
                continue
            span = f"{lo:.1f}-{hi:.1f}" if hi != float("inf") else f">= {lo:.1f}"
            lines.append(f"| {name} | {members} | {what_if} | {span} | {len(e)} | "
                         f"{statistics.mean(e):+.3f} | {statistics.stdev(e):.3f} | "
                         f"{min(e):+.3f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n", 1)[0])
    ap.add_argument("-w", "--workload", default="long-cot")
    ap.add_argument("--groups", type=int, default=30)
    ap.add_argument("--members", type=int, action="append")
    ap.add_argument("--what-if", action="append", choices=WHAT_IFS)
    a = ap.parse_args()
    if not 2 <= a.groups <= 10_000:
        ap.error(f"--groups must be in 2..10000, got {a.groups}")
    members = a.members or [2, 3]
    if not all(2 <= m <= 8 for m in members):
        ap.error("--members must be in 2..8")
    rows = [(a.workload, m, w, errors(a.workload, m, a.groups, w))
            for w in a.what_if or ["none"] for m in members]
    print(table(rows))


if __name__ == "__main__":
    main()
