"""A rollout started on part of its set during a partner's tail grows back to the whole
set when the partner lets go (and still shrinks through its own tail)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from policies import registry
from policies.base import Action, ClusterSnapshot, Placement, PoolMode
from slurmrl.leases.invariants import check_table
from slurmrl.model import Layout, Phase, RlRequest
from slurmrl.sim.engine import SimConfig, Simulation
from slurmrl.sim.workload import Segment, SimJob


class OnePool:
    """Every job into one shared pool: the first opens it, the others join."""

    name = "one-pool"
    mode = PoolMode.LEASE

    def place(self, snapshot: ClusterSnapshot) -> Sequence[Placement]:
        if snapshot.pools:
            pid = snapshot.pools[0].pool_id
            return [Placement(j.job_id, Action.JOIN, pid) for j in snapshot.waiting]
        return [Placement(j.job_id, Action.OPEN, -1, j.request.gpus) for j in snapshot.waiting]


def job(jid: int, submit: float, segs: list[tuple[Phase, float]],
        tail: tuple[tuple[float, int], ...]) -> SimJob:
    return SimJob(jid, "c", f"u{jid}", submit, "Qwen2.5-7B", 7e9, 8, Layout.COLOCATED, 8,
                  (tuple(Segment(p, s) for p, s in segs),), tail, None, None, False)


def run(jobs: list[SimJob], **config: Any) -> Simulation:
    """The jobs in one pool of 8 GPUs, round-robin slicing; `config`: SimConfig flags."""
    sim = Simulation(jobs, SimConfig(gpus=8, **config), OnePool(),
                     lambda: registry.load("slice", "round-robin"),
                     registry.load("admission", "site-limits"))
    return sim.run()


def tail_and_newcomer() -> list[SimJob]:
    """A's rollout needs 4 GPUs after half its time (its tail), then A has a long gap;
    B arrives in A's tail (t=60) and starts on the 4 free GPUs, at half speed."""
    return [job(1, 0.0, [(Phase.ROLLOUT, 100.0), (Phase.REWARD, 200.0), (Phase.TRAIN, 10.0)],
                ((0.5, 4),)),
            job(2, 60.0, [(Phase.ROLLOUT, 100.0)], ())]


def test_a_rollout_started_on_half_its_set_grows_when_the_partner_releases() -> None:
    # B gets A's other 4 GPUs when A's rollout ends at t=100 (0.1 s to activate B's
    # resident services there)
    sim = run(tail_and_newcomer())
    rb = sim.runs[2]
    assert rb.finished_at is not None
    # 40 s at half speed (20 s of work), then 80 s at full speed: ends ~180, not 260
    assert abs(rb.finished_at - 180.1) < 0.5
    # B's lease GPU-seconds: 4 GPUs from 60 to 100, 8 from 100 to ~180
    assert abs(rb.lease_gpu_s - (4 * 40 + 8 * 80)) < 8
    for pool in sim.closed:
        check_table(pool.table)


def test_the_grown_rollout_gives_gpus_back_through_its_own_tail() -> None:
    a = job(1, 0.0, [(Phase.ROLLOUT, 100.0), (Phase.REWARD, 300.0), (Phase.TRAIN, 10.0)],
            ((0.5, 4),))
    # B's own tail: 2 GPUs suffice after 80% of its rollout
    b = job(2, 60.0, [(Phase.ROLLOUT, 100.0), (Phase.REWARD, 1.0)], ((0.8, 2),))
    sim = run([a, b])
    rb = sim.runs[2]
    # 60-100: 4 GPUs, 20 s of work; 100.1-160.1: 8 GPUs to 80% of the work; then 2 GPUs
    # for the last 20% (needing 2, it runs at full speed): ends at ~180.1
    assert rb.finished_at is not None and abs(rb.finished_at - 181.1) < 0.5
    assert abs(rb.lease_gpu_s - (4 * 40.1 + 8 * 60 + 2 * 20)) < 8


def test_a_disaggregated_sync_does_not_wait_for_the_partners_rollout_set() -> None:
    def dis(jid: int, submit: float, segs: list[tuple[Phase, float]]) -> SimJob:
        return SimJob(jid, "c", f"u{jid}", submit, "Qwen2.5-7B", 7e9, 8, Layout.DISAGGREGATED,
                      4, (tuple(Segment(p, s) for p, s in segs),), (), None, None, False)

    # B's rollout holds the rollout set (GPUs 0-3) until t=100; A trains on 4-7 and syncs
    # there: the weights reach A's rollout engine when it is next activated
    b = dis(1, 0.0, [(Phase.ROLLOUT, 100.0)])
    a = dis(2, 1.0, [(Phase.TRAIN, 10.0), (Phase.SYNC, 1.0)])
    sim = run([b, a])
    fa = sim.runs[2].finished_at
    assert fa is not None and abs(fa - 12.0) < 0.5


def test_lower_bound_counts_a_disaggregated_sync_on_the_trainer_set() -> None:
    """The lower bound uses the GPU sets the controller leases (`RlRequest.gpus_for`)."""
    segs = ((Phase.ROLLOUT, 10.0), (Phase.TRAIN, 6.0), (Phase.SYNC, 2.0), (Phase.REWARD, 3.0))
    job = SimJob(1, "d", "u1", 0.0, "Qwen2.5-7B", 7e9, 8, Layout.DISAGGREGATED, 4,
                 (tuple(Segment(p, s) for p, s in segs),), (), None, None, False)
    assert job.busy_gpu_s() == 10.0 * 4 + 6.0 * 4 + 2.0 * 4
    req = RlRequest(gpus=8, layout=Layout.DISAGGREGATED, rollout_gpus=4)
    for phase in (Phase.ROLLOUT, Phase.TRAIN, Phase.SYNC):
        assert job.set_size(phase) == len(req.gpus_for(phase))


def test_a_rollout_that_may_not_grow_stays_on_the_part_it_was_granted() -> None:
    # as test_a_rollout_started_on_half_its_set_grows_when_the_partner_releases, with
    # growing off (the controller's one-engine rollouts): B runs at half speed to the end
    sim = run(tail_and_newcomer(), grow=False)
    rb = sim.runs[2]
    assert rb.finished_at is not None and abs(rb.finished_at - 260.0) < 0.5
    assert abs(rb.lease_gpu_s - 4 * 200) < 8
    for pool in sim.closed:
        check_table(pool.table)


def test_the_controllers_grow_takes_the_partners_gpus_once_nobody_waits_for_them() -> None:
    # as test_a_rollout_started_on_half_its_set_grows_when_the_partner_releases: A goes
    # to its reward gap at t=100, nobody waits for its GPUs, and B's lease takes them,
    # growing as the controller does (`Lease.grow`: free GPUs no waiter asks for)
    sim = run(tail_and_newcomer(), grow_free_only=True)
    rb = sim.runs[2]
    assert rb.finished_at is not None and abs(rb.finished_at - 180.1) < 0.5
    assert abs(rb.lease_gpu_s - (4 * 40 + 8 * 80)) < 8
    for pool in sim.closed:
        check_table(pool.table)


def test_the_controllers_grow_leaves_gpus_a_partner_waits_for() -> None:
    # A trains right after its rollout: its training asks for all 8 GPUs, so B's grow
    # gets none of A's freed ones and B's rollout runs on its 4 to the end (t=260); A
    # trains once B is done. The designed (queued) grow takes them instead
    a = job(1, 0.0, [(Phase.ROLLOUT, 100.0), (Phase.TRAIN, 10.0), (Phase.REWARD, 50.0)],
            ((0.5, 4),))
    b = job(2, 60.0, [(Phase.ROLLOUT, 100.0)], ())
    free_only = run([a, b], grow_free_only=True)
    rb, ra = free_only.runs[2], free_only.runs[1]
    assert rb.finished_at is not None and abs(rb.finished_at - 260.0) < 0.5
    assert abs(rb.lease_gpu_s - 4 * 200) < 8
    assert ra.finished_at is not None and ra.finished_at > 260.0 + 10.0
    queued = run([a, b])
    assert queued.runs[2].finished_at is not None and queued.runs[2].finished_at < 250.0
