"""A colocated job's weight sync follows its training on the GPUs it holds (a lease
switch) instead of queueing behind the partner's whole training; where the job holds
only part of the pool (a disaggregated trainer set) it switches only if it is the member
behind, and here, its partner having waited its whole training, it queues."""

from __future__ import annotations

from policies import registry
from slurmrl.leases.invariants import check_table
from slurmrl.model import Layout, Phase
from slurmrl.sim.engine import SimConfig, Simulation
from slurmrl.sim.workload import Segment, SimJob
from tests.sim.test_elastic_rollout import OnePool


def job(jid: int, submit: float, segs: list[tuple[Phase, float]],
        layout: Layout = Layout.COLOCATED) -> SimJob:
    roll = 8 if layout is Layout.COLOCATED else 4
    return SimJob(jid, "c", f"u{jid}", submit, "Qwen2.5-7B", 7e9, 8, layout, roll,
                  (tuple(Segment(p, s) for p, s in segs),), (), None, None, False)


def run(jobs: list[SimJob]) -> Simulation:
    sim = Simulation(jobs, SimConfig(gpus=8), OnePool(),
                     lambda: registry.load("slice", "round-robin"),
                     registry.load("admission", "site-limits"))
    return sim.run()


def test_a_colocated_sync_follows_its_training_ahead_of_the_waiting_partner() -> None:
    # A trains 0-50 s on the whole pool; B asks for it at t=10 to train 50 s. A syncs
    # at once (2 s) and is done at 52; B trains after it, not before A's sync
    a = job(1, 0.0, [(Phase.TRAIN, 50.0), (Phase.SYNC, 2.0)])
    b = job(2, 10.0, [(Phase.TRAIN, 50.0)])
    sim = run([a, b])
    fa, fb = sim.runs[1].finished_at, sim.runs[2].finished_at
    assert fa is not None and abs(fa - 52.0) < 0.01
    assert fb is not None and 102.0 <= fb < 103.0  # 52 + its activation + 50
    for pool in sim.closed:
        check_table(pool.table)


def test_a_disaggregated_sync_queues_behind_the_partners_training() -> None:
    # the trainer set (GPUs 4-7) is part of the pool, and B, waiting for it since t=10,
    # has waited all its time, A none: no switch, and round-robin serves B's training
    # before A's sync
    a = job(1, 0.0, [(Phase.TRAIN, 50.0), (Phase.SYNC, 2.0)], Layout.DISAGGREGATED)
    b = job(2, 10.0, [(Phase.TRAIN, 50.0)], Layout.DISAGGREGATED)
    sim = run([a, b])
    fa, fb = sim.runs[1].finished_at, sim.runs[2].finished_at
    assert fb is not None and 100.0 <= fb < 101.0
    assert fa is not None and fb + 2.0 <= fa < fb + 3.0
