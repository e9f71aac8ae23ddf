"""Floating pools in the simulator (`SimConfig.floating`), placed here by a test policy:
members of one GPU count take whichever whole window is free, tails pack beside each
other, and the pool takes and gives back windows as members come and go. The nodes hold
64 GPUs, so that every pool here fits one, as the controller's floating pools must."""

from __future__ import annotations

from collections.abc import Sequence

import pytest

from policies import registry
from policies.base import Action, ClusterSnapshot, Placement, PoolMode, SiteLimits
from slurmrl.leases.invariants import check_table
from slurmrl.model import Layout, Phase
from slurmrl.sim.engine import SimConfig, SimError, Simulation
from slurmrl.sim.metrics import compute
from slurmrl.sim.workload import Segment, SimJob

G = 8


class Windows:
    """Every job into one pool of `windows` windows; later ones join, and a join asks
    for `grow_to` windows when given."""

    name = "windows"
    mode = PoolMode.LEASE

    def __init__(self, windows: int, grow_to: int | None = None) -> None:
        self.windows, self.grow_to = windows, grow_to

    def place(self, snapshot: ClusterSnapshot) -> Sequence[Placement]:
        if snapshot.pools:
            pid = snapshot.pools[0].pool_id
            size = None if self.grow_to is None else self.grow_to * G
            return [Placement(j.job_id, Action.JOIN, pid, size, floating=True)
                    for j in snapshot.waiting]
        return [Placement(j.job_id, Action.OPEN, -1, self.windows * G, floating=True)
                for j in snapshot.waiting]


def job(jid: int, segs: list[tuple[Phase, float]], steps: int = 5, submit: float = 0.0,
        tail: tuple[tuple[float, int], ...] = ()) -> SimJob:
    step = tuple(Segment(p, s) for p, s in segs)
    return SimJob(jid, "c", f"u{jid}", submit, "Qwen2.5-7B", 7e9, G, Layout.COLOCATED, G,
                  (step,) * steps, tail, None, None, False)


def run(jobs: list[SimJob], policy: Windows, **config: object) -> Simulation:
    config.setdefault("gpus_per_node", 64)
    cfg = SimConfig(gpus=64, floating=True, limits=SiteLimits(max_jobs_per_pool=5),
                    **config)  # type: ignore[arg-type]
    return Simulation(jobs, cfg, policy, lambda: registry.load("slice", "fifo"),
                      registry.load("admission", "site-limits")).run()


def slowdowns(sim: Simulation) -> list[float]:
    return [((r.finished_at or 0.0) - (r.placed_at or 0.0)) / r.solo_s
            for r in sorted(sim.runs.values(), key=lambda r: r.job.job_id)]


def test_three_members_on_two_windows_each_phase_on_whichever_window_is_free() -> None:
    # each trains 100 s then checks rewards 100 s: at most two train at once, so with two
    # windows nobody waits beyond the handoffs, where one window would make them queue
    jobs = [job(i, [(Phase.TRAIN, 100.0), (Phase.REWARD, 100.0)]) for i in (1, 2, 3)]
    sim = run(jobs, Windows(2))
    pool = sim.closed[0]
    assert max(slowdowns(sim)) < 1.15  # a third's training fits the others' gaps
    one = run([job(i, [(Phase.TRAIN, 100.0), (Phase.REWARD, 100.0)]) for i in (1, 2, 3)],
              Windows(1))
    assert max(slowdowns(one)) > max(slowdowns(sim)) + 0.2
    assert pool.windows is not None and len(pool.windows) == 1  # retired as members ended
    check_table(pool.table)


def test_a_job_alone_in_two_windows_gives_one_back_and_pays_only_for_what_it_kept() -> None:
    sim = run([job(1, [(Phase.TRAIN, 100.0), (Phase.REWARD, 100.0)])], Windows(2))
    m = compute(sim)
    # the spare window goes back once the pool sees it has more windows than members
    assert m.used_gpu_h * 3600 < 1.01 * G * 1000.0
    assert slowdowns(sim) == [1.0]


def test_a_join_that_asks_for_another_window_grows_the_pool() -> None:
    a = job(1, [(Phase.TRAIN, 100.0), (Phase.REWARD, 10.0)])
    b = job(2, [(Phase.TRAIN, 100.0), (Phase.REWARD, 10.0)], submit=50.0)
    sim = run([a, b], Windows(1, grow_to=2))
    # b trains on the window it brought, beside a: neither waits for the other
    assert max(slowdowns(sim)) < 1.05
    assert sim.free == 64


def test_packed_tails_share_a_window_so_a_third_member_trains_beside_them() -> None:
    # rollouts need the whole set for their first 20%, then 4 of 8 GPUs
    segs = [(Phase.ROLLOUT, 200.0), (Phase.TRAIN, 60.0), (Phase.REWARD, 20.0)]
    jobs = [job(i, segs, tail=((0.2, 4),)) for i in (1, 2, 3)]
    held = run(jobs, Windows(2))
    packed = run(jobs, Windows(2), pack_tails=True)
    assert max(slowdowns(packed)) < max(slowdowns(held)) - 0.05
    assert compute(packed).savings > compute(held).savings
    for sim in (held, packed):
        check_table(sim.closed[0].table)


def test_a_floating_pool_past_one_node_is_refused_unless_windows_may_span_nodes() -> None:
    jobs = [job(i, [(Phase.TRAIN, 100.0), (Phase.REWARD, 100.0)]) for i in (1, 2, 3)]
    with pytest.raises(SimError, match="would span nodes of 8 GPUs"):
        run(jobs, Windows(2), gpus_per_node=8)
    sim = run(jobs, Windows(2), gpus_per_node=8, floating_across_nodes=True)
    assert all(r.finished_at is not None for r in sim.runs.values())
