"""Floating pools on nodes whose GPU count the window size does not divide: each window
is its own Slurm allocation on the pool's node (or, across nodes, on another), so it
never straddles two nodes and a node's leftover GPUs hold no window; only a window
wider than a node that is not whole nodes, which the controller could not run, is
refused."""

from __future__ import annotations

import json
from collections.abc import Sequence

import pytest
from click.testing import CliRunner

from policies import registry
from policies.base import Action, ClusterSnapshot, Placement, PoolMode, SiteLimits
from slurmrl.leases.invariants import check_table
from slurmrl.model import Layout, Phase
from slurmrl.sim.cli import simulate
from slurmrl.sim.engine import Pool, SimConfig, SimError, Simulation, window_layout
from slurmrl.sim.workload import Segment, SimJob


class Windows:
    """Every job into one floating pool of `windows` windows of `g` GPUs; later ones
    join it."""

    name = "windows"
    mode = PoolMode.LEASE

    def __init__(self, g: int, windows: int) -> None:
        self.g, self.windows = g, windows

    def place(self, snapshot: ClusterSnapshot) -> Sequence[Placement]:
        if snapshot.pools:
            pid = snapshot.pools[0].pool_id
            return [Placement(j.job_id, Action.JOIN, pid, None, floating=True)
                    for j in snapshot.waiting]
        return [Placement(j.job_id, Action.OPEN, -1, self.windows * self.g, floating=True)
                for j in snapshot.waiting]


class Watched(Simulation):
    """Records every window a floating pool has held, after every event."""

    seen: set[range]

    def _check(self, pool: Pool) -> None:
        super()._check(pool)
        self.seen = getattr(self, "seen", set()) | set(pool.windows or ())


def job(jid: int, g: int) -> SimJob:
    step = (Segment(Phase.TRAIN, 100.0), Segment(Phase.REWARD, 100.0))
    return SimJob(jid, "c", f"u{jid}", 0.0, "Qwen2.5-1B", 1e9, g, Layout.COLOCATED, g,
                  (step,) * 3, (), None, None, False)


def run(g: int, windows: int, node: int, jobs: int = 3, **config: object) -> Watched:
    cfg = SimConfig(gpus=256, floating=True, gpus_per_node=node,
                    limits=SiteLimits(max_jobs_per_pool=5), **config)  # type: ignore[arg-type]
    sim = Watched([job(i, g) for i in range(1, jobs + 1)], cfg, Windows(g, windows),
                  lambda: registry.load("slice", "fifo"),
                  registry.load("admission", "site-limits"))
    sim.run()
    return sim


def on_one_node_or_whole_nodes(w: range, node: int) -> bool:
    if len(w) <= node:
        return w.start // node == (w.stop - 1) // node
    return w.start % node == 0 and len(w) % node == 0


def test_window_layout_leaves_a_node_s_leftover_gpus_to_no_window() -> None:
    # 16-GPU windows on 72-GPU nodes (NVL72): four a node, GPUs 64..71 left over
    assert window_layout(0, 5, 16, 72) == [range(0, 16), range(16, 32), range(32, 48),
                                           range(48, 64), range(72, 88)]
    # 3-GPU windows on 8-GPU nodes: two a node; a later window goes on from the newest
    assert window_layout(0, 3, 3, 8) == [range(0, 3), range(3, 6), range(8, 11)]
    assert window_layout(11, 2, 3, 8) == [range(11, 14), range(16, 19)]
    # sizes that divide the node, and windows of whole nodes: contiguous, as before
    assert window_layout(0, 3, 4, 8) == [range(0, 4), range(4, 8), range(8, 12)]
    assert window_layout(0, 2, 16, 8) == [range(0, 16), range(16, 32)]


def test_windows_that_do_not_divide_the_node_share_one_node() -> None:
    # two 3-GPU windows on an 8-GPU node: the controller allocates each on the pool's
    # node (2 GPUs left over); this run used to abort ("would straddle nodes")
    sim = run(3, 2, 8)
    assert all(r.finished_at is not None for r in sim.runs.values())
    assert sim.seen == {range(0, 3), range(3, 6)}
    for pool in sim.closed:
        check_table(pool.table)
    assert sim.free == 256


def test_across_nodes_no_window_straddles_and_leftover_gpus_hold_none() -> None:
    for g, windows, node in ((3, 3, 8), (16, 5, 72), (3, 5, 4)):
        sim = run(g, windows, node, jobs=windows + 1, floating_across_nodes=True)
        assert all(r.finished_at is not None for r in sim.runs.values())
        assert len(sim.seen) >= windows
        assert all(on_one_node_or_whole_nodes(w, node) for w in sim.seen), sorted(
            (w.start, w.stop) for w in sim.seen)
        assert sim.free == 256


def test_a_window_of_whole_nodes_floats_and_one_of_part_nodes_is_refused() -> None:
    sim = run(16, 2, 8, floating_across_nodes=True)  # two whole 8-GPU nodes a window
    assert all(r.finished_at is not None for r in sim.runs.values())
    assert all(on_one_node_or_whole_nodes(w, 8) for w in sim.seen)
    with pytest.raises(SimError, match="window of 12 GPUs would straddle nodes of 8"):
        run(12, 2, 8, floating_across_nodes=True)  # no Slurm allocation is 1.5 nodes
    with pytest.raises(SimError, match="would span nodes of 8 GPUs"):
        run(3, 3, 8)  # 9 GPUs: more than one node's windows, without across nodes


def test_cli_floating_on_nvl72_nodes_with_16_gpu_windows_runs() -> None:
    # math-sync's 16-GPU jobs float on 72-GPU nodes: four windows a node; this run
    # used to abort ("floating windows of 16 GPUs would straddle nodes of 72 GPUs")
    res = CliRunner().invoke(simulate, ["-w", "math-sync", "--floating", "--gpus-per-node",
                                        "72", "--jobs", "12", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.output)
    assert out["metrics"]["jobs"] == 12 and out["meta"]["gpus_per_node"] == 72
