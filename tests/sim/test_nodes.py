"""The simulator's node model (`SimConfig.nodes`, `simulate --nodes`): the cluster's GPUs
are nodes, and a pool takes all of its GPUs from one node, as the controller's pools do
(one Slurm allocation on one node each). Without it, one bag of GPUs (the suite's
figures)."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from click.testing import CliRunner

from policies import registry
from slurmrl.model import Layout, Phase
from slurmrl.sim.cli import simulate
from slurmrl.sim.engine import SimConfig, SimError, Simulation
from slurmrl.sim.runner import config_for, run_jobs
from slurmrl.sim.workload import Segment, SimJob, generate, load


def _per_node_peak(sim: Simulation) -> dict[int, int]:
    """Each node's most GPUs held by pools open at once, from the pools' lives."""
    pools = [*sim.closed, *sim.pools.values()]
    assert all(p.node is not None for p in pools), "a pool on no node"
    # (when, -1 a close before an open at the same instant, pool)
    lives = sorted([(p.opened_at, 1, p.pool_id) for p in pools]
                   + [(p.closed_at if p.closed_at is not None else 1e18, -1, p.pool_id)
                      for p in pools])
    by_id = {p.pool_id: p for p in pools}
    held: dict[int, int] = {}
    peak: dict[int, int] = {}
    for _, sign, pid in lives:
        p = by_id[pid]
        assert p.node is not None
        held[p.node] = held.get(p.node, 0) + sign * p.gpus
        peak[p.node] = max(peak.get(p.node, 0), held[p.node])
    return peak


@pytest.mark.parametrize("pairing", ["complementary", "dedicated", "greedy"])
@pytest.mark.parametrize("arrivals", ["steady", "bursty"])
def test_every_pool_lies_on_one_node_within_its_gpus(pairing: str, arrivals: str) -> None:
    # mixed-sizes: jobs of 1-8 GPUs on 16 nodes of 8
    w = load("mixed-sizes")
    jobs = generate(w, 0, arrivals, 40)
    cfg = replace(config_for(w, check_invariants=False), nodes=True)
    sim = run_jobs(jobs, cfg, pairing).sim
    assert all(r.finished_at is not None for r in sim.runs.values() if r.admitted)
    peak = _per_node_peak(sim)
    assert peak and all(g <= cfg.gpus_per_node for g in peak.values()), peak
    assert sim.node_free == [cfg.gpus_per_node] * (cfg.gpus // cfg.gpus_per_node)


def _job(jid: int, gpus: int, submit: float = 0.0) -> SimJob:
    step = (Segment(Phase.TRAIN, 100.0), Segment(Phase.REWARD, 100.0))
    return SimJob(jid, "c", f"u{jid}", submit, "Qwen2.5-1B", 1e9, gpus, Layout.COLOCATED,
                  gpus, (step,) * 3, (), None, None, True)


def _run(jobs: list[SimJob], **config: object) -> Simulation:
    cfg = SimConfig(**{"gpus": 16, "gpus_per_node": 8, "nodes": True, **config})  # type: ignore[arg-type]
    return Simulation(jobs, cfg, registry.load("pairing", "dedicated"),
                      lambda: registry.load("slice", "round-robin"),
                      registry.load("admission", "site-limits")).run()


def test_a_job_larger_than_every_node_is_refused_and_one_no_node_has_room_for_waits() -> None:
    # two nodes of 8: jobs of 6 and 6 take one node each; a third of 4 finds 2 free on
    # each (4 in all) and waits for a node to free; a 12-GPU job is refused
    sim = _run([_job(1, 6), _job(2, 6), _job(3, 4), _job(4, 12)])
    r = sim.runs
    assert not r[4].admitted and r[4].reject_reason == (
        "--rl-gpus=12 is more than any node has (the largest has 8); a pool's GPUs are "
        "one node's")
    assert r[3].placed_at is not None and r[1].finished_at is not None
    assert r[3].placed_at >= min(r[1].finished_at, r[2].finished_at or 0.0)  # type: ignore[type-var]
    # without nodes, the 4-GPU job starts at once on the 4 GPUs free in all
    bag = _run([_job(1, 6), _job(2, 6), _job(3, 4)], nodes=False)
    assert bag.runs[3].placed_at == 0.0


def test_nodes_and_floating_pools_do_not_go_together() -> None:
    with pytest.raises(SimError, match="do not go together"):
        _run([_job(1, 2)], floating=True)
    out = CliRunner().invoke(simulate, ["--nodes", "--floating", "--jobs", "2"])
    assert out.exit_code == 2 and "--nodes" in out.output


def test_simulate_nodes_reports_it_and_waits_more_on_a_fragmented_mix() -> None:
    runs = {}
    for flag in ([], ["--nodes"]):
        out = CliRunner().invoke(simulate, ["-w", "mixed-sizes", "--jobs", "40", "--seed",
                                            "0", "--arrivals", "bursty", "--no-check",
                                            "--json", *flag])
        assert out.exit_code == 0, out.output
        runs[bool(flag)] = json.loads(out.output)
    assert runs[True]["meta"]["nodes"] is True and runs[False]["meta"]["nodes"] is False
    # a pool's GPUs on one node: on this mix of 1-8 GPU jobs some wait for a node with
    # room where the bag had enough GPUs (0.42 h on average against 0.25 h here)
    assert runs[True]["metrics"]["queue_mean_h"] > runs[False]["metrics"]["queue_mean_h"]
