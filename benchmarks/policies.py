"""Every pairing policy on every suite workload, several seeds: the table and plots.

    python benchmarks/policies.py [--jobs 80] [--seeds 2] [--procs 2] [--no-write]

Writes the "Policies and simulator" section of docs/benchmarks.md (between its markers,
leaving other sections alone) and docs/benchmarks/policies_*.png, and measures the two
speed targets (1,000 jobs over 30 simulated days; pairing a batch of 1,000 waiting jobs).
Figures are means over seeds and over steady and bursty arrivals.
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import statistics
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from policies import registry  # noqa: E402
from slurmrl.sim.runner import config_for, run_jobs  # noqa: E402
from slurmrl.sim.workload import WORKLOAD_DIR, generate, load  # noqa: E402

WORKLOADS = ["math-sync", "long-cot", "agentic-tools", "disaggregated", "mixed-sizes",
             "polytrace-mix"]
POLICIES = ["complementary", "dedicated", "random", "greedy", "fifo-lock", "gang"]
BEGIN, END = "<!-- policies:begin -->", "<!-- policies:end -->"


def one(args: tuple[str, str, str, int, int, float]) -> dict[str, Any]:
    wname, policy, arrivals, seed, n_jobs, load_scale = args
    w = load(wname)
    jobs = generate(w, seed, arrivals, n_jobs, load_scale)
    t = time.perf_counter()
    r = run_jobs(jobs, config_for(w, check_invariants=False), policy)
    out = r.metrics.as_dict()
    out.update(workload=wname, policy=policy, arrivals=arrivals, seed=seed, load=load_scale,
               wall_s=time.perf_counter() - t)
    if wname == "polytrace-mix" and arrivals == "steady" and seed == 0 and load_scale == 1.0:
        from slurmrl.sim.metrics import slowdowns

        out["slowdowns"] = slowdowns(r.sim)
    return out


def speed() -> dict[str, float]:
    """The two speed targets, measured on this machine."""
    from dataclasses import replace

    w = load("polytrace-mix")
    jobs = generate(w, 0, "steady", 1000, load_scale=(1000 / (30 * 24)) / 0.8)
    cfg = replace(config_for(w, check_invariants=False), gpus=640)
    t = time.perf_counter()
    r = run_jobs(jobs, cfg, "complementary")
    sim_s = time.perf_counter() - t
    span_d = max(j.submit_s for j in jobs) / 86400
    # a batch of 1,000 waiting jobs, profiled from that run, paired in one round
    from policies.base import ClusterSnapshot

    snaps = tuple(r.sim._snapshot(run) for run in list(r.sim.runs.values())[:1000])
    snap = ClusterSnapshot(0.0, (), snaps, {"pools": 10**6}, cfg.limits)
    pol = registry.load("pairing", "complementary")
    from policies import complementarity

    complementarity.clear_caches()
    t = time.perf_counter()
    placements = pol.place(snap)
    pair_s = time.perf_counter() - t
    paired = sum(1 for p in placements if p.reason.startswith("paired"))
    return {"sim_1000_s": sim_s, "arrival_span_days": span_d, "sim_events": r.sim.events,
            "pair_1000_s": pair_s, "pair_1000_paired": paired}


def table(rows: list[dict[str, Any]]) -> str:
    lines = ["| workload | policy | savings % | ideal % | captured % | p50 slowdown | "
             "p95 slowdown | max slowdown | gap to lower bound (pts) | queue h |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for wname in WORKLOADS:
        for pol in POLICIES:
            rs = [r for r in rows if r["workload"] == wname and r["policy"] == pol
                  and r["load"] == 1.0]
            if not rs:
                continue

            def m(k: str, rs: list[dict[str, Any]] = rs) -> float:
                return statistics.fmean(r[k] for r in rs)

            lines.append(
                f"| {wname} | {pol} | {100 * m('savings'):.1f} | {100 * m('ideal_savings'):.1f} "
                f"| {100 * m('captured'):.0f} | {m('slowdown_p50'):.3f} | "
                f"{m('slowdown_p95'):.3f} | {m('slowdown_max'):.2f} | "
                f"{100 * (m('ideal_savings') - m('savings')):.1f} | {m('queue_mean_h'):.1f} |")
    return "\n".join(lines)


def targets(rows: list[dict[str, Any]], sp: dict[str, float]) -> str:
    """The issue's targets against what was measured, stated plainly."""
    out = []

    def mean(w: str, p: str, k: str) -> float:
        return statistics.fmean(r[k] for r in rows if r["workload"] == w
                                and r["policy"] == p and r["load"] == 1.0)

    for w in WORKLOADS:
        cap, p95 = mean(w, "complementary", "captured"), mean(w, "complementary", "slowdown_p95")
        sav = mean(w, "complementary", "savings")
        better = [p for p in POLICIES if p not in ("complementary", "dedicated")
                  and mean(w, p, "savings") > sav + 1e-3]
        ok = cap >= 0.9 and p95 <= 1.15 and not better
        out.append(f"- {w}: captured {100 * cap:.0f}% of ideal (target >= 90%), p95 slowdown "
                   f"{p95:.3f} (target <= 1.15); baselines saving more: "
                   f"{', '.join(better) or 'none'} -> **{'met' if ok else 'MISSED'}**")
    pt = mean("polytrace-mix", "complementary", "savings")
    out.append(f"- polytrace-mix savings {100 * pt:.1f}% (target >= 40%) -> "
               f"**{'met' if pt >= 0.4 else 'MISSED'}**")
    out.append(f"- 1,000 jobs / 30 days: {sp['sim_1000_s']:.1f} s (target <= 60 s) -> "
               f"**{'met' if sp['sim_1000_s'] <= 60 else 'MISSED'}**")
    out.append(f"- pairing 1,000 waiting jobs: {sp['pair_1000_s']:.2f} s (target <= 1 s) -> "
               f"**{'met' if sp['pair_1000_s'] <= 1 else 'MISSED'}**")
    return "\n".join(out)


def plots(rows: list[dict[str, Any]], outdir: Path) -> list[str]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    outdir.mkdir(parents=True, exist_ok=True)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for pol in POLICIES:
        pts = sorted({r["load"] for r in rows if r["workload"] == "polytrace-mix"})
        ys = [statistics.fmean(r["savings"] * 100 for r in rows if r["policy"] == pol
                               and r["workload"] == "polytrace-mix" and r["load"] == x)
              for x in pts]
        ax.plot(pts, ys, marker="o", label=pol)
    ax.set_xlabel("arrival rate (x the workload's)")
    ax.set_ylabel("GPU-hours saved vs dedicated (%)")
    ax.set_title("polytrace-mix: savings vs load")
    ax.axhline(0, color="grey", lw=0.5)
    ax.legend(fontsize=8)
    fig.tight_layout()
    a = outdir / "policies_savings_vs_load.png"
    fig.savefig(a, dpi=110)
    plt.close(fig)
    fig, ax = plt.subplots(figsize=(6.5, 4))
    for r in rows:
        if "slowdowns" in r:
            xs = r["slowdowns"]
            ax.plot(xs, [(i + 1) / len(xs) for i in range(len(xs))], label=r["policy"])
    ax.set_xlabel("per-job slowdown (finished - placed) / solo")
    ax.set_ylabel("fraction of jobs")
    ax.set_xlim(0.98, 2.5)
    ax.set_title("polytrace-mix (steady, seed 0): slowdown CDF")
    ax.legend(fontsize=8)
    fig.tight_layout()
    b = outdir / "policies_slowdown_cdf.png"
    fig.savefig(b, dpi=110)
    plt.close(fig)
    return [str(a.relative_to(ROOT / "docs")), str(b.relative_to(ROOT / "docs"))]


def write_section(text: str) -> None:
    doc = ROOT / "docs" / "benchmarks.md"
    old = doc.read_text() if doc.exists() else "# Benchmarks\n"
    block = f"{BEGIN}\n{text.rstrip()}\n{END}"
    if BEGIN in old and END in old:
        new = re.sub(re.escape(BEGIN) + ".*?" + re.escape(END), lambda _: block, old,
                     flags=re.S)
    else:
        new = old.rstrip() + "\n\n" + block + "\n"
    doc.write_text(new)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--jobs", type=int, default=80)
    ap.add_argument("--seeds", type=int, default=2)
    ap.add_argument("--procs", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--no-write", action="store_true")
    a = ap.parse_args()
    tasks = [(w, p, arr, s, a.jobs, 1.0) for w in WORKLOADS for p in POLICIES
             for arr in ("steady", "bursty") for s in range(a.seeds)]
    tasks += [("polytrace-mix", p, "steady", s, a.jobs, x) for p in POLICIES
              for s in range(a.seeds) for x in (0.5, 1.5, 2.0)]
    t0 = time.perf_counter()
    with ProcessPoolExecutor(a.procs) as ex:
        rows = list(ex.map(one, tasks, chunksize=1))
    grid_s = time.perf_counter() - t0
    sp = speed()
    tab = table(rows)
    print(tab)
    print(sp)
    if a.no_write:
        return
    pngs = plots(rows, ROOT / "docs" / "benchmarks")
    suite = ", ".join(sorted(x.stem for x in WORKLOAD_DIR.glob("*.json")))
    text = SECTION.format(
        table=tab, jobs=a.jobs, seeds=a.seeds, grid_s=grid_s, runs=len(tasks),
        machine=f"{platform.machine()}, {os.cpu_count()} cores, Python {platform.python_version()}",
        suite=suite, png_a=pngs[0], png_b=pngs[1], targets=targets(rows, sp), **sp)
    write_section(text)


SECTION = """## Policies and simulator

Produced by `python benchmarks/policies.py --jobs {jobs} --seeds {seeds}` ({runs} runs in
{grid_s:.0f} s on {machine}). Each row: mean over {seeds} seeds x (steady, bursty)
arrivals of {jobs} jobs drawn from the workload (suite: {suite}; parameters and sources in
`workloads/*.json` and `workloads/README.md`). Reproduce one cell with
`slurmrl simulate -w WORKLOAD --pairing POLICY --jobs {jobs} --seed S --arrivals A --json`.

### Definitions (slurmrl/sim/metrics.py)

- **dedicated GPU-h**: each job alone on its own GPUs for its solo duration (every phase
  and gap back to back, no waiting): sum of gpus x solo time.
- **used GPU-h**: the GPU-seconds the cluster allocated to pools, idle or not: sum over
  pools of gpus x (closed - opened). The ledger charges it to members in proportion to
  the lease GPU-seconds each used in that pool, so members' charges add up to it.
- **savings** = 1 - used / dedicated.
- **lower bound**: per job, its GPU phases at the GPU count of their set with the
  rollout's tail consolidated (G/2, G/4, ... 1 GPU as active sequences thin), plus per
  step the cheapest handoff (park + activate) it could have, capped by that step's gap
  time. **ideal savings** = 1 - lower bound / dedicated; **captured** = savings / ideal.
  **gap to lower bound** = ideal - savings, in percentage points.
- **slowdown** = (finished - placed) / solo time (queueing excluded; it is reported
  separately as queue h = mean placed - submitted).

### Status against the issue's targets (measured, not tuned)

{targets}

Why the default policy falls short, as far as the simulator shows: it pairs only when
every member's *predicted* slowdown stays under its limit (1.15 by default in the suite),
and with the job model here — a step is ~90% wall time in GPU phases, the rollout's tail
frees GPUs only to a partner rollout that can start on half the set, training needs the
whole set — few pairs satisfy that, so it mostly opens pools alone (near-zero slowdown,
little saving). The baselines save more only by accepting p95 slowdowns of 1.3-2.3. The
lower bound counts the consolidated tail as reclaimable; no policy here reclaims most of
it, so "captured" is low for all. `dedicated` and `gang` overlap at 0% in the load plot.

### Results

{table}

![savings vs load]({png_a})

![slowdown CDF]({png_b})

### Speed (targets: <= 60 s and <= 1 s)

- 1,000 jobs (polytrace-mix, arrivals over {arrival_span_days:.0f} simulated days, 640 GPUs),
  default policy, invariant checks off: **{sim_1000_s:.1f} s** ({sim_events} events).
- Pairing one batch of 1,000 waiting jobs (profiled, no open pools) with `complementary`:
  **{pair_1000_s:.2f} s** ({pair_1000_paired} jobs paired).
"""


if __name__ == "__main__":
    main()
