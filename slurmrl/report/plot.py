"""`slurmrl report --plot`: a timeline of leases and the reward curves, as one PNG.

Top panel: one row per pool GPU ("p3 gpu1"), a coloured bar for each lease hold (one
colour per job, legend by job id and name), a black tick where a GPU passed from one
job to another (a handoff: the controller parked the previous holder's services and
activated the next one's). Bottom panel: each job's mean reward per step against the
same time axis, so that learning can be read beside the sharing.

Uses matplotlib's Agg backend (no display needed). Known limits: with hundreds of GPUs
the rows get thin; filter with `-j`.
"""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

from slurmrl.report.compute import Hold, Report, ReportInput


def plot_timeline(data: ReportInput, report: Report, path: str | Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    starts = [h.start for h in data.holds] + [j.registered_at for j in data.jobs]
    t0 = min(starts) if starts else data.now
    rows = sorted({(h.pool_id, h.gpu) for h in data.holds}
                  | {(p.pool_id, g) for p in data.pools for g in range(p.gpus)})
    row_of = {r: i for i, r in enumerate(rows)}
    names = {j.job_id: j.name for j in data.jobs}
    cmap = plt.get_cmap("tab10")
    colour = {jid: cmap(i % 10) for i, jid in enumerate(sorted(names))}

    has_rewards = any(j.rewards for j in report.jobs)
    fig, axes = plt.subplots(
        2 if has_rewards else 1, 1, sharex=True, squeeze=False,
        figsize=(12, 2.0 + 0.45 * max(1, len(rows)) + (3.0 if has_rewards else 0.0)),
        gridspec_kw={"height_ratios": [max(1.5, 0.45 * len(rows)), 3.0]
                     if has_rewards else [1]},
    )
    ax = axes[0][0]
    by_job: dict[int, list[Hold]] = defaultdict(list)
    for h in data.holds:
        by_job[h.job_id].append(h)
    for jid, hs in sorted(by_job.items()):
        for i, h in enumerate(hs):
            end = h.end if h.end is not None else data.now
            ax.broken_barh([((h.start - t0) / 60, max(end - h.start, 0.0) / 60)],
                           (row_of[(h.pool_id, h.gpu)] - 0.4, 0.8),
                           facecolors=colour.get(jid, "grey"), edgecolor="none",
                           label=f"job {jid} {names.get(jid, '')}".strip() if i == 0 else None)
    for x in report.handoffs:
        y = row_of[(x.pool_id, x.gpu)]
        ax.plot([(x.at - t0) / 60] * 2, [y - 0.45, y + 0.45], color="black", lw=0.6)
    if report.handoffs:
        ax.plot([], [], color="black", lw=0.6, label="handoff (park/activate)")
    ax.set_yticks(range(len(rows)), [f"p{p} gpu{g}" for p, g in rows])
    ax.set_ylim(-0.6, len(rows) - 0.4)
    ax.set_xlim(left=0.0)
    ax.invert_yaxis()
    ax.set_title(f"Leases on pool GPUs — granted {report.totals.granted_gpu_s / 3600:.3f} "
                 f"GPU-h vs {report.totals.dedicated_gpu_s / 3600:.3f} dedicated"
                 + (f" (saved {100 * report.totals.saved:.1f}%)"
                    if report.totals.saved is not None else ""))
    if ax.get_legend_handles_labels()[0]:  # no lease at all: no legend (nor its warning)
        ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    ax.grid(axis="x", alpha=0.3)
    if has_rewards:
        rx = axes[1][0]
        for j in report.jobs:
            if not j.rewards:
                continue
            rx.plot([(at - t0) / 60 for _, at, _ in j.rewards], [r for _, _, r in j.rewards],
                    marker=".", color=colour.get(j.job_id, "grey"),
                    label=f"job {j.job_id} {j.name}".strip())
        rx.set_ylabel("mean reward per step")
        rx.set_title("Reward curves (as reported by each driver)")
        rx.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
        rx.grid(alpha=0.3)
    axes[-1][0].set_xlabel("minutes since the first job registered")
    try:
        fig.tight_layout()
        fig.savefig(str(path), dpi=110)
    finally:
        plt.close(fig)
