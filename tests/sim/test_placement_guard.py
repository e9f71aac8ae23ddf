"""What the simulator enacts of a pairing policy's placements: the controller's guard on
joins, fixed groups, batch pairs of the fixed-pair baselines, gang quanta."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from policies import registry
from policies.base import Action, ClusterSnapshot, Placement, PoolMode
from slurmrl.sim import costs
from slurmrl.sim.engine import SimConfig, SimError, Simulation
from slurmrl.sim.runner import config_for, run_jobs
from slurmrl.sim.workload import SimJob, generate, validate

GiB = 2**30


def jobs_of(n: int, model: str = "Qwen2.5-7B", gpus: Any = 8, steps: Any = 3,
            host_gib: float | None = None, seed: int = 0) -> tuple[list[SimJob], SimConfig]:
    """`n` jobs of one class, all submitted at t = 0, and their cluster (64 GPUs)."""
    w = validate({
        "format": "slurmrl-workload/1", "name": "guard", "jobs": n,
        "cluster": {"gpus": 64, "host_mem_per_pool_gib": host_gib},
        "arrivals": {"steady": {"rate_per_h": 10.0}, "bursty": {"rate_per_h": 10.0}},
        "limits": {"max_slowdown": 3.0, "default_max_slowdown": 3.0, "max_jobs_per_pool": 3,
                   "max_gpus_per_job": 16},
        "classes": [{"name": "c", "weight": 1, "model": model, "gpus": gpus,
                     "layout": "colocated", "steps": steps, "step_s": 60.0,
                     "shares": {"rollout": 0.3, "train": 0.2, "idle": 0.5}, "tail": "none"}],
    })
    jobs = [replace(j, submit_s=0.0) for j in generate(w, seed, "steady")]
    return jobs, config_for(w)


class _OnePoolForAll:
    """A buggy site policy (not shipped): every job into one pool, whatever it holds."""

    name, mode = "one-pool", PoolMode.LEASE

    def place(self, snapshot: ClusterSnapshot) -> list[Placement]:
        if snapshot.pools:
            pid = snapshot.pools[0].pool_id
            return [Placement(j.job_id, Action.JOIN, pid) for j in snapshot.waiting]
        return [Placement(j.job_id, Action.OPEN, -1, j.request.gpus) for j in snapshot.waiting]


def simulate(jobs: list[SimJob], cfg: SimConfig, pairing: Any) -> Simulation:
    return Simulation(jobs, cfg, pairing, lambda: registry.load("slice", "round-robin"),
                      registry.load("admission", "site-limits")).run()


def test_a_join_over_the_host_memory_budget_opens_its_own_pool_instead() -> None:
    # 70B jobs park ~1,043 GiB each: two do not fit 2,048 GiB of host memory per pool
    jobs, cfg = jobs_of(3, model="Llama-3-70B", host_gib=2048)
    sim = simulate(jobs, cfg, _OnePoolForAll())
    assert all(len(p.history) == 1 for p in sim.closed)  # nobody shared
    assert len(sim.refused) == 2 and "host memory" in sim.refused[0][2]
    assert all(r.finished_at is not None for r in sim.runs.values())
    # with room for all three, the same placements share one pool
    sim = simulate(jobs, replace(cfg, host_mem_per_pool_bytes=4096 * GiB), _OnePoolForAll())
    assert [len(p.history) for p in sim.closed] == [3] and not sim.refused
    assert 3 * costs.host_bytes(jobs[0]) <= 4096 * GiB


def test_a_join_of_another_gpu_count_or_beyond_the_sites_most_is_refused() -> None:
    jobs, cfg = jobs_of(4, gpus={"choices": [4, 8, 16]}, seed=3)
    assert {j.gpus for j in jobs} == {4, 8, 16}
    sim = simulate(jobs, cfg, _OnePoolForAll())  # a 16-GPU job in an 8-GPU pool: no error
    for p in sim.closed:
        assert len({m.job.gpus for m in p.history}) == 1 and p.gpus == p.history[0].job.gpus
    assert sim.refused
    jobs, cfg = jobs_of(4)
    sim = simulate(jobs, replace(cfg, limits=replace(cfg.limits, max_jobs_per_pool=2)),
                   _OnePoolForAll())
    # job 3 finds the pool full and opens its own, which job 4 then joins (the
    # controller's guard does the same: the provisional pool id names the newer pool)
    assert [len(p.history) for p in sim.closed] == [2, 2]
    assert len(sim.refused) == 1 and "max_jobs_per_pool" in sim.refused[0][2]


def test_a_join_across_rl_groups_is_refused() -> None:
    # jobs 1, 3 in group "a", 2, 4 in none: the buggy policy puts all four in one pool
    jobs, cfg = jobs_of(4, model="Qwen2.5-0.5B")
    jobs = [replace(j, group="a" if j.job_id % 2 else None) for j in jobs]
    sim = simulate(jobs, cfg, _OnePoolForAll())
    for p in sim.closed:
        assert len({m.job.group for m in p.history}) == 1
    assert any("different groups" in why for _, _, why in sim.refused)


@pytest.mark.parametrize("pairing", ["complementary", "greedy", "random", "fifo-lock",
                                     "gang"])
def test_a_run_never_puts_jobs_of_different_groups_in_one_pool(pairing: str) -> None:
    # six light jobs arriving together, two per group (two named, one unnamed): each
    # policy pairs them, and only within a group
    jobs, cfg = jobs_of(6, model="Qwen2.5-0.5B")
    groups = ["a", "b", None]
    jobs = [replace(j, group=groups[i % 3]) for i, j in enumerate(jobs)]
    # (placed before any step is seen, `greedy` judges them by the model-size prior, a
    # duty of 0.73 each: it packs two only with its cap raised)
    sim = run_jobs(jobs, cfg, pairing, params={"greedy": {"max_duty": 1.5}}).sim
    assert all(r.finished_at is not None for r in sim.runs.values())
    for p in sim.closed:
        assert len({m.job.group for m in p.history}) == 1, p.history
    assert any(len(p.history) > 1 for p in sim.closed)
    assert not sim.refused  # the policies themselves keep to the groups


@pytest.mark.parametrize("pairing", ["fifo-lock", "gang"])
def test_a_fixed_pair_takes_no_new_member_when_one_leaves(pairing: str) -> None:
    # job 2 joins job 1 a second after it; job 1 is short, job 2 long; job 3 arrives
    # once job 1 has left and must not take its place: it opens a pool of its own
    (a, b, c), cfg = jobs_of(3, model="Qwen2.5-0.5B")
    a = replace(a, steps=a.steps[:1])
    b = replace(b, steps=b.steps * 10, submit_s=1.0)
    c = replace(c, submit_s=b.solo_s() / 2)
    sim = run_jobs([a, b, c], cfg, pairing).sim
    pools = {r.job.job_id: r.pool for r in sim.runs.values()}
    assert pools[1] is pools[2] and pools[3] is not pools[2]
    assert sim.runs[1].finished_at is not None and sim.runs[1].finished_at < c.submit_s
    assert not sim.refused  # the policy saw the pool closed and did not ask


@pytest.mark.parametrize("pairing", ["fifo-lock", "gang"])
def test_jobs_arriving_together_share_pools_under_fixed_pairs(pairing: str) -> None:
    jobs, cfg = jobs_of(4, model="Qwen2.5-0.5B")
    m = run_jobs(jobs, cfg, pairing).metrics
    assert m.pools == 2 and m.shared_pools == 2


def test_the_gang_quantum_is_the_policys_parameter() -> None:
    jobs, cfg = jobs_of(2, model="Qwen2.5-0.5B", steps=20)
    jobs[1] = replace(jobs[1], submit_s=1.0)  # joins the first's pool

    def run(quantum_s: float) -> Simulation:
        return run_jobs(jobs, cfg, "gang", params={"gang": {"quantum_s": quantum_s}}).sim

    short, long = run(30.0), run(3000.0)
    assert [len(p.history) for p in short.closed] == [2]
    # each quantum ends in a switch: a 100x longer quantum switches far less often
    assert sum(r.handoffs for r in short.runs.values()) > \
        10 * sum(r.handoffs for r in long.runs.values())

    class NoQuantum:
        name, mode = "no-quantum", PoolMode.GANG

        def place(self, snapshot: ClusterSnapshot) -> list[Placement]:
            return []

    with pytest.raises(SimError, match="no quantum_s"):
        simulate(jobs, cfg, NoQuantum())
